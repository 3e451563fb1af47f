//! How a submitted turn's result will be picked up (later, in the response, in a batch), which
//! decides what its job names and whether its front door waits.

/// How a submitter will come for a turn's result.
#[derive(Debug, Clone, Copy)]
pub struct Pickup<'a> {
    /// This process's direct reply address, when it waits for the turn (see
    /// [`crate::queue::ReplyBus::subscribe_direct`]).
    pub reply_to: Option<&'a str>,
    /// Whether the submitter may read the session's reply queue later
    /// ([`crate::queue::JobMeta::reply_queue_wanted`]).
    pub reply_queue_wanted: bool,
    /// The batch the turn is a line of, when its completion is told of (`batch.completed`),
    /// with the batch's webhook (admitted already) for a line that names none of its own.
    pub batch: Option<(&'a str, Option<&'a str>)>,
    /// The service tier the turn's model calls ask for (a batch's), over the agent
    /// context's.
    pub service_tier: Option<crate::contexts::ServiceTier>,
}

impl<'a> Pickup<'a> {
    /// A turn submitted to be read later (`POST /v1/turns`, `aptix turns submit`): by status
    /// reads, long-polls, streams or the session's reply queue; `reply_to` when this process
    /// may also wait for it.
    pub fn later(reply_to: Option<&'a str>) -> Self {
        Self {
            reply_to,
            reply_queue_wanted: true,
            batch: None,
            service_tier: None,
        }
    }
    /// A turn whose answer goes out in the HTTP response that submitted it (the synchronous
    /// endpoint), through this process's direct address.
    pub fn in_response(reply_to: Option<&'a str>) -> Self {
        Self {
            reply_to,
            reply_queue_wanted: false,
            batch: None,
            service_tier: None,
        }
    }
    /// A batch line: its result is read from the batch.
    pub fn in_batch() -> Self {
        Self {
            reply_to: None,
            reply_queue_wanted: false,
            batch: None,
            service_tier: None,
        }
    }

    /// The same pickup, the turn's calls at `tier` (when given).
    pub fn at_tier(self, tier: Option<crate::contexts::ServiceTier>) -> Self {
        Self {
            service_tier: tier,
            ..self
        }
    }

    /// A line of batch `id` whose completion is told of, with the batch's `webhook`.
    pub fn in_tracked_batch(id: &'a str, webhook: Option<&'a str>) -> Self {
        Self {
            batch: Some((id, webhook)),
            ..Self::in_batch()
        }
    }
}
