//! The HTTP API's handlers, one file per group of routes. Handlers stay thin: they
//! authenticate, read the body within its limit, parse, call the front door (or the store, the
//! broker, the index) and map the outcome to an `InvokeResult`; the shared extractors and
//! answers are in [`super::http`].

pub mod admin;
pub mod batches;
pub mod dead_letters;
pub mod index;
pub mod ops;
pub mod runs;
pub mod sessions;
pub mod sync;
pub mod tenant;
pub mod turns;
pub mod webhooks;

#[cfg(test)]
mod tests;
