//! An error and its causes as one line of text, for messages that are text (the CLI's last
//! word, logs of errors that cross threads).
//!
//! Owns: that line. Must not: classify errors.

/// An error and its causes on one line (`outer: inner: …`), for messages that are text. A
/// cause whose text the line already ends with is not repeated: some clients' errors (lapin's,
/// redis-rs's) write their cause into their own message and also give it as their source.
/// (Ours do one or the other, never both: `tests/it/errors.rs`.)
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line an operator reads names each cause once, however many layers repeat it.
    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("broker unavailable: {0}")]
        struct Repeats(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("cannot set up RabbitMQ")]
        struct Names(#[source] Box<dyn std::error::Error>);
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            with_causes(&Names(Box::new(Repeats(refused())))),
            "cannot set up RabbitMQ: broker unavailable: refused"
        );
        // A cause that adds something is kept.
        #[derive(Debug, thiserror::Error)]
        #[error("broker unavailable")]
        struct Hides(#[source] std::io::Error);
        assert_eq!(
            with_causes(&Names(Box::new(Hides(refused())))),
            "cannot set up RabbitMQ: broker unavailable: refused"
        );
    }
}
