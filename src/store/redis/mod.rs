//! The Redis session store: what makes "every accepted turn completes exactly once" hold when
//! many workers on many machines share one Redis.
//!
//! Key layout (all under the namespace, with the session id as a hash tag so one session's keys
//! sit in one Redis Cluster slot):
//!
//! | key | type | holds | expires |
//! |---|---|---|---|
//! | `<ns>:session:{<sid>}` | string | session state (JSON) | idle-session retention |
//! | `<ns>:turns:{<sid>}` | list | turn ids, oldest first | the longer of idle-session and turn retention, from the last turn added |
//! | `<ns>:turn:{<sid>}:<tid>` | string | turn record (JSON) | turn retention |
//! | `<ns>:ledger:{<sid>}:<tid>` | hash | server tool outputs by `call_id`, the runs begun | turn retention |
//! | `<ns>:prompt:<id>` | string | a call's instructions and tools (JSON), which transcripts name | twice the turn retention |
//! | `<ns>:lease:{<sid>}` | string | `<token>:<holder>` of the current lease (a turn's run: its count of runs begun as the token) | lease TTL |
//! | `<ns>:fence:{<sid>}` | integer | last fencing token a lease taken outside a turn's run was given | as the turns index |
//! | `<ns>:owner:{<sid>}` | string | the tenant that owns the session | as the turns index |
//! | `<ns>:contexts:{<sid>}` | string | the session's latched contexts (JSON) | as the turns index |
//! | `<ns>:live:{<sid>}:<tid>` | list | a streaming turn's latest live events (JSON) | 30 s after the latest |
//! | `<ns>:batches:{<tenant>}` | sorted set | the tenant's batch ids by submission time (ms) | turn retention |
//! | `<ns>:runs:{<tenant>}` | sorted set | the tenant's turns (`<sid> <tid>`) by acceptance time (ms): the runs index, noted by a quiet front door's admission script, else by one `ZADD` for the notes of a go (`group_commit.rs`) | turn retention (trimmed each minute) |
//! | `<ns>:batchlines:{<batch>}:events:<len>:<sid>:<tid>` | set | URLs a batch line's turn event is still being delivered to | turn retention |
//! | `<ns>:workers` | hash | each worker's heartbeat (JSON), by worker | 10 minutes after the latest |
//! | `<ns>:replicated:{<sid>}` | string | marker written before `WAIT` (`APTIX_REDIS_MIN_REPLICAS`) | 5 s |
//!
//! Every write a worker makes during a turn runs in a Lua script that first checks the lease
//! key still holds the writer's `<token>:<holder>`; a stale writer gets `FENCED` and nothing is
//! written. The scripts a turn runs are sent as one `EVALSHA` command written in place
//! (`call.rs`), loaded again where the server answers `NOSCRIPT`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands as _;

use super::{
    Admission, Begun, ContextIds, Grant, Lease, Retention, RunWrite, RunsNote, Saved, SessionState,
    SessionStore, StoreError, ToolOutput, TurnRecord,
};
use crate::contract::{SessionId, TurnId};

/// How long the workers' heartbeats are kept after the latest was written.
const HEARTBEATS_KEPT_MS: i64 = 10 * 60 * 1000;

mod admission;
mod call;
mod codec;
mod connection;
mod group_commit;
mod many;
mod reads;
mod records;
mod replication;
mod runs;
mod scripts;
mod steps;

pub use call::ScriptCall;
use codec::encode;
pub use connection::{
    DEFAULT_REDIS_TIMEOUT, DEFAULT_REPLICA_TIMEOUT, RedisConnection, RedisOptions, connection,
};
use scripts::Scripts;
use steps::BeginStep;

/// Session state in Redis.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConnection,
    namespace: String,
    retention: Retention,
    scripts: std::sync::Arc<Scripts>,
    fenced: std::sync::Arc<AtomicU64>,
    round_trips: std::sync::Arc<AtomicU64>,
    replication: Option<std::sync::Arc<replication::Replication>>,
    /// When this process last wrote each prompt ([`RecordWriter::keep_prompt`]).
    prompts_kept: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>,
    /// When this process last trimmed each tenant's runs index ([`RecordWriter::index_turn`]),
    /// by tenant: the acceptance time, in milliseconds, of the note that did. Looked up on
    /// every admission, so hashed with foldhash rather than SipHash.
    runs_trimmed: std::sync::Arc<std::sync::Mutex<foldhash::HashMap<String, i64>>>,
    /// The runs index notes this process writes together ([`RecordWriter::index_turn`]).
    runs_notes: std::sync::Arc<group_commit::GroupCommit<crate::store::IndexedTurn>>,
    /// Admissions under way in this process ([`SessionStore::admit_and_index`]).
    admitting: std::sync::Arc<AtomicUsize>,
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Redis(e)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

fn lease_value(lease: &Lease) -> String {
    let mut value = lease.token.to_string();
    value.push(':');
    value.push_str(&lease.holder);
    value
}

impl RedisStore {
    /// Connects (the connection manager reconnects by itself after failures).
    pub async fn connect(
        url: &str,
        namespace: &str,
        retention: Retention,
    ) -> Result<Self, StoreError> {
        Self::connect_with(url, namespace, retention, &RedisOptions::default()).await
    }

    /// Connects with `options`: each connection attempt and each command's answer bounded by
    /// the timeout (a stalled Redis is an `Unavailable` error after that long, never a wait
    /// without end), and for `rediss://` the extra CA trusted.
    pub async fn connect_with(
        url: &str,
        namespace: &str,
        retention: Retention,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        let conn = connection(url, options).await.map_err(unavailable)?;
        let replication = match options.min_replicas {
            0 => None,
            min => Some(std::sync::Arc::new(replication::Replication {
                conn: std::sync::RwLock::new(connection(url, options).await.map_err(unavailable)?),
                renewed: tokio::sync::Mutex::new(std::time::Instant::now()),
                url: url.to_string(),
                options: options.clone(),
                min,
                // The wait must end before the answer's own bound does.
                timeout: options
                    .replica_timeout
                    .min(options.timeout.mul_f32(0.8))
                    .max(Duration::from_millis(1)),
            })),
        };
        Ok(Self {
            conn,
            namespace: namespace.to_string(),
            retention,
            scripts: std::sync::Arc::new(Scripts::load()),
            fenced: std::sync::Arc::new(AtomicU64::new(0)),
            round_trips: std::sync::Arc::new(AtomicU64::new(0)),
            replication,
            prompts_kept: Default::default(),
            runs_trimmed: Default::default(),
            runs_notes: Default::default(),
            admitting: Default::default(),
        })
    }

    /// The store's Lua scripts by name, each with the SHA1 that `EVALSHA` sends for it: what an
    /// operator sees in `MONITOR` or `SLOWLOG`, and how the fault-injection tests tell the
    /// writes of a turn apart on the wire.
    pub fn script_hashes(&self) -> Vec<(&'static str, String)> {
        self.scripts.hashes()
    }

    /// Loads every script into the server's script cache (what each script's first `EVALSHA`
    /// on a server that lacks it otherwise does after a `NOSCRIPT` answer). On a cluster this
    /// reaches one node; connect to each node to load them everywhere.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        for script in self.scripts.all() {
            script.load_async(&mut conn).await.map_err(unavailable)?;
        }
        Ok(())
    }

    /// Requests sent to Redis so far (a pipeline or a script counts once).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// A connection for one request, counted.
    fn conn(&self) -> RedisConnection {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.clone()
    }

    /// The namespace prefix of every key.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    // Keys are built by concatenation: a turn writes about twenty of them, and the formatting
    // machinery costs several times a copy. A script call writes a key's parts straight into
    // its command (`ScriptCall::key_joined`) unless the name is needed again.
    fn key(&self, kind: &str, session: &SessionId) -> String {
        self.key_parts(kind, session).concat()
    }

    fn turn_key(&self, kind: &str, session: &SessionId, turn: &TurnId) -> String {
        self.turn_key_parts(kind, session, turn).concat()
    }

    /// The parts [`RedisStore::key`] joins.
    fn key_parts<'a>(&'a self, kind: &'a str, session: &'a SessionId) -> [&'a str; 6] {
        [&self.namespace, ":", kind, ":{", session.as_str(), "}"]
    }

    /// The parts [`RedisStore::turn_key`] joins.
    fn turn_key_parts<'a>(
        &'a self,
        kind: &'a str,
        session: &'a SessionId,
        turn: &'a TurnId,
    ) -> [&'a str; 7] {
        let ns = self.namespace.as_str();
        [ns, ":", kind, ":{", session.as_str(), "}:", turn.as_str()]
    }

    fn map_fenced(&self, session: &SessionId, e: redis::RedisError) -> StoreError {
        if e.code() == Some("FENCED") {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(session_id = %session, "rejected a write from a stale lease holder");
            StoreError::Fenced(session.to_string())
        } else {
            unavailable(e)
        }
    }

    /// Deletes every key under the namespace (tests and tear-down; uses SCAN, not KEYS). Not on
    /// a cluster, where SCAN sees one node: let the keys expire there.
    pub async fn delete_namespace(&self) -> Result<u64, StoreError> {
        if self.conn.is_cluster() {
            return Err(StoreError::Unavailable(
                "deleting a namespace is not supported on a Redis Cluster; its keys expire with their retention".into(),
            ));
        }
        let mut conn = self.conn.clone();
        let pattern = format!("{}:*", self.namespace);
        let mut cursor: u64 = 0;
        let mut deleted = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            if !keys.is_empty() {
                let n: u64 = conn.del(&keys).await.map_err(unavailable)?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }
}

#[async_trait::async_trait]
impl SessionStore for RedisStore {
    async fn create_turn(
        &self,
        _grant: &Grant,
        turn: &TurnRecord,
    ) -> Result<Option<TurnRecord>, StoreError> {
        match self.admit(None, None, turn, None).await?.0 {
            Admission::Turn(existing) => Ok(existing.map(|b| *b)),
            other => Err(StoreError::Corrupt(format!(
                "creating turn {} of session {} claimed or latched something: {other:?}",
                turn.turn_id, turn.session_id
            ))),
        }
    }

    async fn admit_turn(
        &self,
        _grant: &Grant,
        owner: Option<&str>,
        contexts: &ContextIds,
        turn: &TurnRecord,
    ) -> Result<Admission, StoreError> {
        Ok(self.admit(owner, Some(contexts), turn, None).await?.0)
    }

    async fn admit_and_index(
        &self,
        _grant: &Grant,
        owner: Option<&str>,
        contexts: &ContextIds,
        turn: &TurnRecord,
        accepted_ms: i64,
    ) -> Result<(Admission, RunsNote), StoreError> {
        // A cluster's script reaches only its own slot, and a note with company goes with
        // the next go of notes (one `ZADD` for many): either way its caller notes the turn.
        let (others, _admitting) = group_commit::UnderWay::enter(&self.admitting);
        if self.conn.is_cluster() || self.notes_have_company(others) {
            let (admission, _) = self.admit(owner, Some(contexts), turn, None).await?;
            return Ok((admission, RunsNote::Yours));
        }
        let (admission, missed) = self
            .admit(owner, Some(contexts), turn, Some(accepted_ms))
            .await?;
        Ok((admission, missed.map_or(RunsNote::Noted, RunsNote::Missed)))
    }

    async fn discard_turn(&self, _grant: &Grant, turn: &TurnRecord) -> Result<bool, StoreError> {
        let discarded: i64 = self
            .scripts
            .discard_turn
            .key(self.turn_key("turn", &turn.session_id, &turn.turn_id))
            .key(self.key("turns", &turn.session_id))
            .key(self.key("session", &turn.session_id))
            .key(self.key("contexts", &turn.session_id))
            .key(self.turn_key("ledger", &turn.session_id, &turn.turn_id))
            .arg(encode(turn)?)
            .arg(turn.turn_id.as_str())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(discarded == 1)
    }

    async fn replace_turn(
        &self,
        _grant: &Grant,
        current: &TurnRecord,
        new: &TurnRecord,
    ) -> Result<bool, StoreError> {
        let replaced: i64 = self
            .scripts
            .replace_turn
            .key(self.turn_key("turn", &current.session_id, &current.turn_id))
            .key(self.turn_key("ledger", &current.session_id, &current.turn_id))
            .arg(encode(current)?)
            .arg(encode(new)?)
            .arg(ms(self.retention.turns))
            .arg(current.runs_begun)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(replaced == 1)
    }

    async fn acquire_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let token: Option<u64> = self
            .scripts
            .acquire
            .key(self.key("lease", session))
            .key(self.key("fence", session))
            .arg(holder)
            .arg(ms(ttl))
            .arg(ms(self.retention.turns_index()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(token.map(|token| Lease {
            token,
            holder: holder.to_string(),
        }))
    }

    #[allow(clippy::too_many_arguments)]
    async fn begin_turn(
        &self,
        grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        holder: &str,
        ttl: Duration,
        contexts: Option<&ContextIds>,
        probe: Option<&str>,
    ) -> Result<Begun, StoreError> {
        let step = BeginStep {
            session,
            turn,
            holder,
            ttl,
            contexts,
        };
        let probe = probe.filter(|_| self.steps_reach_other_keys());
        self.begin_as(grant, step, probe).await
    }

    fn steps_reach_other_keys(&self) -> bool {
        // A cluster's script reaches only the session's slot.
        !self.conn.is_cluster()
    }

    async fn renew_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let ok: i64 = self
            .scripts
            .renew
            .key(self.key("lease", session))
            .arg(lease_value(lease))
            .arg(ms(ttl))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(ok == 1)
    }

    async fn release_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .scripts
            .release
            .key(self.key("lease", session))
            .arg(lease_value(lease))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn save(
        &self,
        _grant: &Grant,
        session: Option<&SessionState>,
        turn: &TurnRecord,
        lease: &Lease,
        release: bool,
    ) -> Result<Saved, StoreError> {
        let write = RunWrite {
            session,
            turn,
            lease,
            release,
            stored: false,
            unlisted: false,
            counts: None,
        };
        self.save_as(write).await
    }

    async fn save_run(&self, _grant: &Grant, write: RunWrite<'_>) -> Result<Saved, StoreError> {
        self.save_as(write).await
    }

    async fn record_tool_output(
        &self,
        _grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        entry: ToolOutput<'_>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.record_output.prepare_invoke();
        invocation
            .key(self.key("lease", session))
            .key(self.turn_key("ledger", session, turn))
            .key(self.key("session", session))
            .key(self.key("conversation", session))
            .arg(lease_value(lease))
            .arg(entry.call_id)
            .arg(entry.output)
            .arg(ms(self.retention.turns))
            .arg(entry.session.map(encode).transpose()?.unwrap_or_default())
            .arg(ms(self.retention.sessions));
        for item in entry.session.iter().flat_map(|s| &s.conversation) {
            invocation.arg(encode(item)?);
        }
        let result: Result<i64, _> = invocation.invoke_async(&mut self.conn()).await;
        result.map_err(|e| self.map_fenced(session, e))?;
        Ok(())
    }
}

impl RedisStore {
    /// The set of a batch line's turn events not yet finished, by URL: in the batch's slot,
    /// the session id length-prefixed so no two lines share a key.
    fn line_events_key(&self, id: &str, (sid, tid): (&SessionId, &TurnId)) -> String {
        format!(
            "{}:batchlines:{{{id}}}:events:{}:{sid}:{tid}",
            self.namespace,
            sid.as_str().len()
        )
    }
}

#[cfg(test)]
mod tests;
