//! All integration tests compile into this one binary (faster builds, shared helpers).

mod contract_props;
mod contract_request;
mod contract_response;
