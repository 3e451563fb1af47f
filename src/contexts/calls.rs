//! How an agent context's model calls are made and priced, beyond where they go: background
//! mode, the service tier with its flex fallback, and the prices that estimate a turn's cost.
//! Read from the contexts file (`background`, `serviceTier`, `flexFallbackAfterSecs`,
//! `prices`); the built-in `default` context has none of them.
//!
//! Owns: these settings and their checks. Must not: make calls.

use std::time::Duration;

use serde::Deserialize;

/// The `service_tier` a context's calls ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServiceTier {
    /// The project's setting.
    Auto,
    /// Standard processing.
    Default,
    /// Flex processing: batch prices, slower, and it may answer 429 resource unavailable.
    Flex,
    /// Priority processing.
    Priority,
}

impl ServiceTier {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Default => "default",
            Self::Flex => "flex",
            Self::Priority => "priority",
        }
    }

    /// Reads a tier as the API spells it.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "default" => Some(Self::Default),
            "flex" => Some(Self::Flex),
            "priority" => Some(Self::Priority),
            _ => None,
        }
    }
}

/// Prices of a model, in US dollars per million tokens. Held as micro-dollars (integers), so
/// sums over many turns do not drift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prices {
    /// Uncached input.
    pub input_micros: u64,
    /// Input served from the prompt cache.
    pub cached_input_micros: u64,
    /// Output (reasoning included).
    pub output_micros: u64,
}

/// The `prices` object of the contexts file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct PricesEntry {
    input_per_million: f64,
    cached_input_per_million: Option<f64>,
    output_per_million: f64,
}

impl PricesEntry {
    /// Checked: finite and not negative. Cached input costs as much as input unless given.
    pub(super) fn check(&self) -> Result<Prices, String> {
        let micros = |field: &str, usd: f64| {
            if (0.0..1e9).contains(&usd) {
                Ok((usd * 1e6).round() as u64)
            } else {
                Err(format!(
                    "prices.{field} must be a number of dollars, 0 or more"
                ))
            }
        };
        let input = micros("inputPerMillion", self.input_per_million)?;
        Ok(Prices {
            input_micros: input,
            cached_input_micros: match self.cached_input_per_million {
                Some(c) => micros("cachedInputPerMillion", c)?,
                None => input,
            },
            output_micros: micros("outputPerMillion", self.output_per_million)?,
        })
    }
}

impl Prices {
    /// Reads `input,cached input,output` dollars per million tokens (`2.00,0.50,8.00`).
    pub fn parse_list(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        let [input, cached, output] = parts[..] else {
            return Err(format!(
                "{text:?} is not three prices: input, cached input, output (dollars per million tokens)"
            ));
        };
        let number = |p: &str| {
            p.parse::<f64>()
                .map_err(|_| format!("{p:?} is not a number of dollars"))
        };
        PricesEntry {
            input_per_million: number(input)?,
            cached_input_per_million: Some(number(cached)?),
            output_per_million: number(output)?,
        }
        .check()
    }

    /// The estimated cost of `usage`, in micro-dollars: uncached input, cached input and
    /// output, each at its price.
    pub fn cost_micros(&self, usage: &crate::contract::Usage) -> u64 {
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let uncached = usage.prompt_tokens - cached;
        let part = |tokens: u64, per_million: u64| {
            (u128::from(tokens) * u128::from(per_million) / 1_000_000) as u64
        };
        part(uncached, self.input_micros)
            + part(cached, self.cached_input_micros)
            + part(usage.completion_tokens, self.output_micros)
    }
}

/// The default wait before a `flex` call refused for capacity is made at `default`.
pub const FLEX_FALLBACK_AFTER: Duration = Duration::from_secs(60);

/// How an agent context's calls are made and priced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSettings {
    /// Calls are made in background mode and survive the worker (off by default).
    pub background: bool,
    /// The tier asked for; none sends no `service_tier`.
    pub service_tier: Option<ServiceTier>,
    /// How long `flex` calls refused with 429 resource unavailable are retried before the
    /// call is made at `default`; `None`: never (the turn waits and retries as for any 429).
    pub flex_fallback: Option<Duration>,
    /// Prices for the cost estimate; none: no cost is estimated.
    pub prices: Option<Prices>,
    /// OpenAI's hosted tools every call of the context offers (`hostedTools`).
    pub hosted_tools: Vec<super::HostedTool>,
}

impl Default for CallSettings {
    fn default() -> Self {
        Self {
            background: false,
            service_tier: None,
            flex_fallback: Some(FLEX_FALLBACK_AFTER),
            prices: None,
            hosted_tools: Vec::new(),
        }
    }
}

/// `flexFallbackAfterSecs`: seconds, or `"never"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum FallbackEntry {
    Secs(u64),
    Word(String),
}

impl FallbackEntry {
    pub(super) fn check(&self) -> Result<Option<Duration>, String> {
        match self {
            Self::Secs(s) => Ok(Some(Duration::from_secs(*s))),
            Self::Word(w) if w == "never" => Ok(None),
            Self::Word(w) => Err(format!(
                "flexFallbackAfterSecs must be a number of seconds or \"never\", not {w:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Usage;

    #[test]
    fn cost_prices_uncached_and_cached_input_and_output_apart() {
        let prices = PricesEntry {
            input_per_million: 2.0,
            cached_input_per_million: Some(0.5),
            output_per_million: 8.0,
        }
        .check()
        .unwrap();
        let usage = Usage {
            prompt_tokens: 3_000_000,
            completion_tokens: 1_000_000,
            total_tokens: 4_000_000,
            cached_tokens: 1_000_000,
            reasoning_tokens: 0,
            cost_micros: 0,
        };
        // 2 M uncached at $2, 1 M cached at $0.50, 1 M out at $8.
        assert_eq!(prices.cost_micros(&usage), 12_500_000);
    }

    #[test]
    fn cached_input_costs_as_input_unless_priced_and_bad_prices_are_refused() {
        let p = PricesEntry {
            input_per_million: 1.25,
            cached_input_per_million: None,
            output_per_million: 10.0,
        }
        .check()
        .unwrap();
        assert_eq!(p.cached_input_micros, 1_250_000);
        let bad = PricesEntry {
            input_per_million: -1.0,
            cached_input_per_million: None,
            output_per_million: 1.0,
        }
        .check()
        .unwrap_err();
        assert!(bad.contains("prices.inputPerMillion"), "{bad}");
    }
}
