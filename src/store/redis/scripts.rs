//! The store's Lua scripts. Each write a worker makes during a turn checks first that the lease
//! key still holds the writer's `<token>:<holder>`, and answers `FENCED` without writing if not.

use redis::Script;

/// A Lua function: `latch(key, value, ttl)` sets `key` to `value` unless it holds another, keeps
/// it `ttl` ms either way, and returns what it holds. One command for a new key or one holding
/// `value` already — a session's every turn but the first, whose latch is kept as long as its
/// turns (`SET GET PX`, Redis 7.0 or later: writing the same value again is the `PEXPIRE` it
/// would need); two for one holding another, which is put back (the script is atomic: no
/// reader sees the other value).
macro_rules! latch_fn {
    () => {
        r"
local function latch(key, value, ttl)
  local held = redis.call('SET', key, value, 'GET', 'PX', ttl)
  if not held or held == value then return value end
  redis.call('SET', key, held, 'PX', ttl)
  return held
end
"
    };
}

const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return token
";

/// KEYS: lease, turn, turn's ledger, session, latched contexts, the turn's stop request, and
///       (optional) a key to probe.
/// ARGV: holder, lease TTL ms, contexts TTL ms, contexts JSON or '', turn TTL ms.
/// Returns {token or false, turn JSON or false, ledger as field/value pairs (as before this
/// run), session JSON or false, latched contexts JSON or false, runs begun, stop requested};
/// the rest only when the lease was taken: the session, the contexts for a session not stored
/// yet (latching ARGV[4] unless some are; latched ones keep the TTL the front door's
/// admission gave them moments before), the count of runs begun with this one (kept in
/// the ledger under `runs begun`), and whether the turn has been asked to stop (1 or 0); last,
/// whether the probed key exists (1 or 0; -1 when none was named or the lease not taken).
/// The lease, the turn, the session, the stop request and the latched contexts (all strings)
/// are one `MGET`: a free lease is taken with a plain `SET` (the script is atomic), and a held
/// one costs no write. The fencing token is the turn's count of runs begun, so taking the
/// lease draws no number of its own: the holder (ARGV[1]) names the turn, so a lease's value
/// names the turn and its run, which no other begin step's lease shares. (Leases taken
/// outside a begin step, `ACQUIRE`, are numbered by the session's own counter; the holder's
/// nonce, new at each taking, keeps their values apart from these.) A first run finds its
/// ledger empty (a run records in it only once it has begun, so a ledger without runs begun
/// holds nothing): only a later run reads it, its count of runs begun as before this one.
const BEGIN: &str = r"
local read = redis.call('MGET', KEYS[1], KEYS[2], KEYS[4], KEYS[6], KEYS[5])
local turn, session, stop = read[2], read[3], read[4]
if read[1] then
  return {false, turn, redis.call('HGETALL', KEYS[3]), false, false, 0, 0, -1}
end
local runs = redis.call('HINCRBY', KEYS[3], 'runs begun', 1)
local ledger = {}
if runs > 1 then
  ledger = redis.call('HGETALL', KEYS[3])
  for i = 1, #ledger, 2 do
    if ledger[i] == 'runs begun' then ledger[i + 1] = tostring(runs - 1) end
  end
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
redis.call('SET', KEYS[1], runs .. ':' .. ARGV[1], 'PX', ARGV[2])
local latched = false
if not session and ARGV[4] ~= '' then
  latched = read[5] or redis.call('SET', KEYS[5], ARGV[4], 'NX', 'GET', 'PX', ARGV[3]) or ARGV[4]
end
local probed = -1
if KEYS[7] then probed = redis.call('EXISTS', KEYS[7]) end
return {runs, turn, ledger, session, latched, runs, stop and 1 or 0, probed}
";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// Appends ARGV[first..] to the conversation list KEYS[key] (in slices: `unpack` has a stack
/// limit) and keeps it as long as the session (TTL ms in ARGV[ttl]).
macro_rules! append_conversation {
    ($key:literal, $first:literal, $ttl:literal) => {
        concat!(
            "for i = ",
            $first,
            ", #ARGV, 500 do redis.call('RPUSH', KEYS[",
            $key,
            "], unpack(ARGV, i, math.min(i + 499, #ARGV))) end\n",
            "redis.call('PEXPIRE', KEYS[",
            $key,
            "], ARGV[",
            $ttl,
            "])\n"
        )
    };
}

/// KEYS: lease, turn, turns index, session, ledger, conversation, the turn's stop request,
///       the session's watch mark, then one key per counter to add to.
/// ARGV: lease value, turn JSON, turn TTL ms, release flag, turn id or '' (the record is
///       stored already: not asked whether it is new), session JSON or '', session TTL ms,
///       the counters' TTL ms, their number, '1' when the session's items go to its
///       conversation list or '0' when the session holds them (a session with no list, written
///       by the run's last write: see `RunWrite::unlisted`), a field and an amount for each
///       counter (a hash), then the session's conversation items to append (with a session
///       whose items go to the list).
/// Returns 1 when the turn has been asked to stop (not read by a write that gives the lease
/// back: the run is over), plus 2 when the session is marked watched, plus 4 when a counter
/// could not be added to (a key of another type: never a reason to fail the write). A counter
/// made by its addition (the sum is the amount added) gets the counters' TTL; one already there
/// keeps its own (a day's usage counts: see `tenants::spend`). The lease and both marks
/// are strings: one `MGET` reads the three. (Whether the record is new is asked with `EXISTS`,
/// not learnt from `SET … GET`: that would copy the whole previous record out on every write
/// to save one command; and only by a write whose writer cannot tell.) The ledger (KEYS[5]) is
/// not touched: the begin step and each tool output keep it for the turn's TTL, and what it
/// held at this write is in the record too. Nor is the turns index's expiry, unless this
/// write adds to it: what adds a turn keeps the index the longer of the session's and the
/// turn's retention from then (the admission, or this write for a turn whose admission was
/// lost), so it lasts as long as the session but for the run of the session's last turn, and
/// never ends before the turn it lists could have settled.
const SAVE: &str = concat!(
    r"
local held = redis.call('MGET', KEYS[1], KEYS[8], KEYS[7])
if held[1] ~= ARGV[1] then return redis.error_reply('FENCED stale lease') end
if ARGV[5] ~= '' and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('RPUSH', KEYS[3], ARGV[5])
  local keep = ARGV[7]
  if tonumber(ARGV[3]) > tonumber(keep) then keep = ARGV[3] end
  redis.call('PEXPIRE', KEYS[3], keep)
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
local read = held[2] and 2 or 0
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[1])
elseif held[3] then
  read = read + 1
end
local counters = tonumber(ARGV[9])
local missed = false
for i = 1, counters do
  local key, field, amount = KEYS[8 + i], ARGV[9 + 2 * i], ARGV[10 + 2 * i]
  local sum = redis.pcall('HINCRBY', key, field, amount)
  if type(sum) ~= 'number' then
    missed = true
  elseif sum == tonumber(amount) then
    redis.call('PEXPIRE', key, ARGV[8])
  end
end
if missed then read = read + 4 end
if ARGV[6] == '' then return read end
redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[7])
if ARGV[10] == '0' then return read end
",
    append_conversation!("6", "11 + 2 * counters", "7"),
    "return read\n"
);

/// KEYS: the session's watch mark. ARGV: TTL ms.
/// Sets the mark to last ARGV[1] from now unless it lasts longer already.
/// KEYS: a batch's settled lines (set), its line count, its done flag (one hash slot).
/// ARGV: a settled line's member or '', the line count or '', TTL ms.
/// Returns 1 when every line has settled and the batch is not marked done yet, else 0.
const NOTE_BATCH: &str = r"
if ARGV[1] ~= '' then
  redis.call('SADD', KEYS[1], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
local lines = redis.call('GET', KEYS[2])
if not lines then
  return 0
end
if redis.call('SCARD', KEYS[1]) >= tonumber(lines) then
  return 1
end
return 0
";

const MARK_WATCHED: &str = r"
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
end
return 1
";

/// KEYS: owner, contexts, turn, turns index, the turn's ledger, and (optional) the tenant's
/// runs index.
/// ARGV: tenant or '' (no claim), contexts JSON or '' (no latch), turn JSON, turn TTL ms,
/// turn id, the TTL ms of the session's turns index and latches (they last as long as a turn
/// they list may: the longer of the session's and the turns' retention); with a runs index:
/// the entry's score (ms accepted) and name, and the oldest score to keep or '' (no trim
/// now).
/// Returns {0, owner, false, false} (another tenant's session), {1, latched contexts, false,
/// false} (other contexts), {2, existing turn JSON, its runs begun or false, note}, or {3, false, false, note}
/// (created); stops writing at the first refusal. A turn recorded or found is noted in the
/// runs index (`NX`: a resubmission keeps its first time; a trim drops entries older than
/// the turns and keeps the index as long as them): `note` is false, or why the note failed —
/// a broken index never refuses a turn.
/// Without a tenant and contexts it is the plain create-unless-it-exists of a turn record.
const ADMIT_TURN: &str = concat!(
    latch_fn!(),
    r"
local function note_run()
  if not KEYS[6] then return false end
  if ARGV[9] ~= '' then redis.pcall('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. ARGV[9]) end
  local added = redis.pcall('ZADD', KEYS[6], 'NX', ARGV[7], ARGV[8])
  if type(added) == 'table' and added.err then return added.err end
  if ARGV[9] ~= '' then redis.pcall('PEXPIRE', KEYS[6], ARGV[4]) end
  return false
end
if ARGV[1] ~= '' then
  local owner = latch(KEYS[1], ARGV[1], ARGV[6])
  if owner ~= ARGV[1] then return {0, owner, false, false} end
end
if ARGV[2] ~= '' then
  local latched = latch(KEYS[2], ARGV[2], ARGV[6])
  if latched ~= ARGV[2] then return {1, latched, false, false} end
end
local existing = redis.call('SET', KEYS[3], ARGV[3], 'NX', 'GET', 'PX', ARGV[4])
local note = note_run()
if existing then return {2, existing, redis.call('HGET', KEYS[5], 'runs begun'), note} end
redis.call('RPUSH', KEYS[4], ARGV[5])
redis.call('PEXPIRE', KEYS[4], ARGV[6])
return {3, false, false, note}
"
);

/// KEYS: turn, turns list, session, latched contexts, the turn's ledger. ARGV: the record as
/// created, turn id. Only a turn no run has begun (its ledger counts none) is taken back.
/// A session left with no turn and no state was never run: the contexts its admission latched
/// go with the turn (a job accepted after all latches them again when it begins).
const DISCARD_TURN: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[5], 'runs begun') == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('LREM', KEYS[2], 1, ARGV[2])
if redis.call('LLEN', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[4])
end
return 1
";

/// KEYS: turn, its ledger. ARGV: the record as read, the new record, turn TTL ms, the runs
/// begun when it was read (a run begun since has not written the record yet, but it runs).
const REPLACE_TURN: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[2], 'runs begun') or '0') ~= tonumber(ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
";

/// KEYS: lease, ledger, session, conversation.
/// ARGV: lease value, call id, output, turn TTL ms, session JSON or '' (no mode change),
///       session TTL ms, then the session's conversation items to append (with a session).
/// The ledger entry and the session's new mode are written together or not at all.
const RECORD_OUTPUT: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED stale lease') end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if ARGV[5] == '' then return 1 end
redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
",
    append_conversation!("4", "7", "6"),
    "return 1\n"
);

/// The store's Lua scripts, loaded once per store.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) begin: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) save: Script,
    pub(super) record_output: Script,
    pub(super) admit_turn: Script,
    pub(super) discard_turn: Script,
    pub(super) replace_turn: Script,
    pub(super) mark_watched: Script,
    pub(super) note_batch: Script,
}

impl Scripts {
    /// Each script by name, with the SHA1 Redis knows it by (what `EVALSHA` names in
    /// `MONITOR` or `SLOWLOG`).
    pub(super) fn hashes(&self) -> Vec<(&'static str, String)> {
        self.named()
            .into_iter()
            .map(|(name, script)| (name, script.get_hash().to_string()))
            .collect()
    }

    /// Every script.
    pub(super) fn all(&self) -> Vec<&Script> {
        self.named().into_iter().map(|(_, script)| script).collect()
    }

    fn named(&self) -> [(&'static str, &Script); 11] {
        [
            ("acquire", &self.acquire),
            ("begin", &self.begin),
            ("renew", &self.renew),
            ("release", &self.release),
            ("save", &self.save),
            ("record_output", &self.record_output),
            ("admit_turn", &self.admit_turn),
            ("discard_turn", &self.discard_turn),
            ("replace_turn", &self.replace_turn),
            ("mark_watched", &self.mark_watched),
            ("note_batch", &self.note_batch),
        ]
    }

    /// Every script, ready to be invoked (Redis caches them by hash on first use).
    pub(super) fn load() -> Self {
        Self {
            acquire: Script::new(ACQUIRE),
            begin: Script::new(BEGIN),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            save: Script::new(SAVE),
            record_output: Script::new(RECORD_OUTPUT),
            admit_turn: Script::new(ADMIT_TURN),
            discard_turn: Script::new(DISCARD_TURN),
            replace_turn: Script::new(REPLACE_TURN),
            mark_watched: Script::new(MARK_WATCHED),
            note_batch: Script::new(NOTE_BATCH),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripts name the ledger's count of runs begun as the readers do.
    #[test]
    fn the_scripts_name_the_runs_begun_field_the_readers_read() {
        let field = format!("'{}'", crate::state::RUNS_BEGUN);
        for script in [BEGIN, ADMIT_TURN, DISCARD_TURN, REPLACE_TURN] {
            assert!(script.contains(&field), "{script}");
        }
    }
}
