//! `aptix config`: the effective configuration, or the reference of every setting.

use std::process::ExitCode;

use aptix_worker::config::{Config, Sources, reference};

/// Arguments of `aptix config`.
#[derive(clap::Args)]
pub struct ConfigArgs {
    /// Print the reference of every setting (variable, file key, default, meaning) as Markdown
    /// instead: what docs/configuration.md holds.
    #[arg(long)]
    pub reference: bool,
}

/// Prints the effective configuration (a bad value is an error naming its variable) or the
/// reference.
pub fn config(args: ConfigArgs, sources: &Sources) -> anyhow::Result<ExitCode> {
    if args.reference {
        print!("{}", reference::markdown());
        return Ok(ExitCode::SUCCESS);
    }
    let config = Config::read(sources)?;
    match sources.file_path() {
        Some(path) => println!("# file: {}", path.display()),
        None => println!("# file: none (set APTIX_CONFIG_FILE to read one)"),
    }
    print!("{}", reference::effective(&config));
    Ok(ExitCode::SUCCESS)
}
