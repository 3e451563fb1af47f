//! The chunk index in Redis.
//!
//! Key layout (one hash tag per tenant, so a tenant's whole index sits in one Cluster slot and a
//! file is replaced in one atomic script):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<ns>:rag:{<tenant>}:files:<repo>` | hash | path → `{hash, ids}` of each indexed file |
//! | `<ns>:rag:{<tenant>}:chunk` | hash | chunk id → `{chunk, terms, tokens}` (JSON) |
//! | `<ns>:rag:{<tenant>}:meta` | hash | chunk id → metadata and length (JSON) |
//! | `<ns>:rag:{<tenant>}:term:<term>` | hash | chunk id → `<count of the term>:<chunk length>` |
//! | `<ns>:rag:{<tenant>}:stats` | hash | `chunks`, `tokens` (only while it holds chunks) |
//!
//! Index keys do not expire: an index lives until its files are removed from it. The script
//! that replaces a file builds the `term:` key names itself; they share the tenant's hash tag,
//! so they are in the same Cluster slot as the keys it declares.

use std::collections::{BTreeMap, HashMap};

use crate::store::redis::{RedisConnection, ScriptCall};
use redis::{AsyncCommands as _, Script};
use serde::{Deserialize, Serialize};

use super::{Chunk, ChunkIndex, ChunkMeta, Frequencies, Posting, RagError};

/// Replaces (or, with no chunks and an empty record, removes) one file's chunks. The stats go
/// with the last chunk: their key is the index's presence key, and an index that holds nothing
/// costs a turn no read.
/// KEYS: files, chunk, meta, stats. ARGV: term key prefix, path, file record (or ''), chunk
/// count, then per chunk: id, entry JSON, meta JSON, tokens, term count, (term, count)...
const PUT_FILE: &str = r"
local function drop(id)
  local raw = redis.call('HGET', KEYS[2], id)
  if not raw then return end
  local e = cjson.decode(raw)
  for term, _ in pairs(e.terms) do redis.call('HDEL', ARGV[1] .. term, id) end
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HINCRBY', KEYS[4], 'chunks', -1)
  redis.call('HINCRBY', KEYS[4], 'tokens', -e.tokens)
end
local removed = 0
local old = redis.call('HGET', KEYS[1], ARGV[2])
if old then
  local rec = cjson.decode(old)
  for _, id in ipairs(rec.ids) do drop(id) end
  removed = #rec.ids
end
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  local id, entry, meta = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local tokens, nterms = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  i = i + 5
  drop(id)
  for _ = 1, nterms do
    redis.call('HSET', ARGV[1] .. ARGV[i], id, ARGV[i + 1])
    i = i + 2
  end
  redis.call('HSET', KEYS[2], id, entry)
  redis.call('HSET', KEYS[3], id, meta)
  redis.call('HINCRBY', KEYS[4], 'chunks', 1)
  redis.call('HINCRBY', KEYS[4], 'tokens', tokens)
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
end
if removed > 0 and tonumber(ARGV[4]) == 0
  and tonumber(redis.call('HGET', KEYS[4], 'chunks') or '0') <= 0 then
  redis.call('DEL', KEYS[4])
end
return removed
";

#[derive(Serialize, Deserialize)]
struct FileRecord {
    hash: String,
    ids: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    chunk: Chunk,
    terms: BTreeMap<String, u32>,
    tokens: u32,
}

/// A [`ChunkIndex`] in Redis.
#[derive(Clone)]
pub struct RedisIndex {
    conn: RedisConnection,
    namespace: String,
    put_file: std::sync::Arc<Script>,
    frequencies: std::sync::Arc<Script>,
}

/// KEYS: the tenant's stats, then one term's postings per term. Returns {chunks, tokens,
/// document frequency of each term}; for a tenant with no index only {false, false}: a turn
/// of a tenant that indexed nothing reads one hash, not one per word of its instruction.
const FREQUENCIES: &str = r"
local stats = redis.call('HMGET', KEYS[1], 'chunks', 'tokens')
if not stats[1] then return {false, false} end
local out = {stats[1], stats[2]}
for i = 2, #KEYS do out[#out + 1] = redis.call('HLEN', KEYS[i]) end
return out
";

fn unavailable(e: redis::RedisError) -> RagError {
    RagError::Redis(e)
}

fn corrupt(key: &str, error: serde_json::Error) -> RagError {
    RagError::Decode {
        key: key.to_string(),
        error,
    }
}

/// A posting as stored in a term's hash: `<count of the term>:<chunk length>`.
fn posting(prefix: &str, term: &str, v: &str) -> Result<Posting, RagError> {
    v.split_once(':')
        .and_then(|(tf, len)| {
            Some(Posting {
                tf: tf.parse().ok()?,
                len: len.parse().ok()?,
            })
        })
        .ok_or_else(|| RagError::Corrupt(format!("{prefix}{term}: bad posting {v:?}")))
}

/// Ids read per `HMGET`.
const BATCH: usize = 500;

impl RedisIndex {
    /// Connects (the connection manager reconnects by itself after failures).
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, RagError> {
        Self::connect_with(
            url,
            namespace,
            &crate::store::redis::RedisOptions::default(),
        )
        .await
    }

    /// Connects with `options` (timeouts, the extra CA for `rediss://`).
    pub async fn connect_with(
        url: &str,
        namespace: &str,
        options: &crate::store::redis::RedisOptions,
    ) -> Result<Self, RagError> {
        let conn = crate::store::redis::connection(url, options)
            .await
            .map_err(unavailable)?;
        Ok(Self {
            conn,
            namespace: namespace.to_string(),
            put_file: std::sync::Arc::new(Script::new(PUT_FILE)),
            frequencies: std::sync::Arc::new(Script::new(FREQUENCIES)),
        })
    }

    fn key(&self, tenant: &str, kind: &str) -> String {
        format!("{}:rag:{{{tenant}}}:{kind}", self.namespace)
    }

    async fn hmget<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        ids: &[String],
    ) -> Result<Vec<Option<T>>, RagError> {
        let mut out = Vec::with_capacity(ids.len());
        for part in ids.chunks(BATCH) {
            let raws: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(key)
                .arg(part)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(unavailable)?;
            for raw in raws {
                out.push(
                    raw.map(|r| serde_json::from_str(&r).map_err(|e| corrupt(key, e)))
                        .transpose()?,
                );
            }
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl ChunkIndex for RedisIndex {
    fn presence_key(&self, tenant: &str) -> Option<String> {
        // The index's size: made by the first chunk put, deleted with the last (`PUT_FILE`).
        Some(self.key(tenant, "stats"))
    }

    async fn files(&self, tenant: &str, repo: &str) -> Result<BTreeMap<String, String>, RagError> {
        let key = self.key(tenant, &format!("files:{repo}"));
        let raw: HashMap<String, String> =
            self.conn.clone().hgetall(&key).await.map_err(unavailable)?;
        raw.into_iter()
            .map(|(path, rec)| {
                let rec: FileRecord = serde_json::from_str(&rec).map_err(|e| corrupt(&key, e))?;
                Ok((path, rec.hash))
            })
            .collect()
    }

    async fn put_file(
        &self,
        tenant: &str,
        repo: &str,
        path: &str,
        content_hash: &str,
        chunks: &[Chunk],
    ) -> Result<(), RagError> {
        let record = FileRecord {
            hash: content_hash.to_string(),
            ids: chunks.iter().map(|c| c.id.clone()).collect(),
        };
        let mut inv = self.put_file.prepare_invoke();
        inv.key(self.key(tenant, &format!("files:{repo}")))
            .key(self.key(tenant, "chunk"))
            .key(self.key(tenant, "meta"))
            .key(self.key(tenant, "stats"))
            .arg(self.key(tenant, "term:"))
            .arg(path)
            .arg(serde_json::to_string(&record).map_err(|e| corrupt(path, e))?)
            .arg(chunks.len());
        for c in chunks {
            let terms = c.terms();
            let tokens: u32 = terms.values().sum();
            let meta = c.meta(tokens);
            inv.arg(&c.id)
                .arg(
                    serde_json::to_string(&Entry {
                        chunk: c.clone(),
                        terms: terms.clone(),
                        tokens,
                    })
                    .map_err(|e| corrupt(path, e))?,
                )
                .arg(serde_json::to_string(&meta).map_err(|e| corrupt(path, e))?)
                .arg(tokens)
                .arg(terms.len());
            for (term, tf) in &terms {
                inv.arg(term).arg(format!("{tf}:{tokens}"));
            }
        }
        let _: i64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn remove_file(&self, tenant: &str, repo: &str, path: &str) -> Result<usize, RagError> {
        let removed: i64 = self
            .put_file
            .key(self.key(tenant, &format!("files:{repo}")))
            .key(self.key(tenant, "chunk"))
            .key(self.key(tenant, "meta"))
            .key(self.key(tenant, "stats"))
            .arg(self.key(tenant, "term:"))
            .arg(path)
            .arg("")
            .arg(0)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(usize::try_from(removed).unwrap_or(0))
    }

    async fn postings(
        &self,
        tenant: &str,
        terms: &[String],
    ) -> Result<Vec<HashMap<String, Posting>>, RagError> {
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let prefix = self.key(tenant, "term:");
        let mut pipe = redis::pipe();
        for t in terms {
            pipe.hgetall(format!("{prefix}{t}"));
        }
        let raw: Vec<HashMap<String, String>> = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        raw.into_iter()
            .zip(terms)
            .map(|(list, term)| {
                list.into_iter()
                    .map(|(id, v)| Ok((id, posting(&prefix, term, &v)?)))
                    .collect()
            })
            .collect()
    }

    async fn postings_of(
        &self,
        tenant: &str,
        terms: &[String],
        ids: &[String],
    ) -> Result<Vec<Vec<Option<Posting>>>, RagError> {
        if terms.is_empty() || ids.is_empty() {
            return Ok(vec![Vec::new(); terms.len()]);
        }
        let prefix = self.key(tenant, "term:");
        let mut pipe = redis::pipe();
        for t in terms {
            for part in ids.chunks(BATCH) {
                pipe.cmd("HMGET").arg(format!("{prefix}{t}")).arg(part);
            }
        }
        let raw: Vec<Vec<Option<String>>> = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let per_term = ids.len().div_ceil(BATCH);
        let columns: Vec<Vec<Option<Posting>>> = raw
            .chunks(per_term)
            .zip(terms)
            .map(|(parts, term)| {
                parts
                    .iter()
                    .flatten()
                    .map(|v| v.as_deref().map(|v| posting(&prefix, term, v)).transpose())
                    .collect::<Result<_, _>>()
            })
            .collect::<Result<_, _>>()?;
        if columns.len() != terms.len() || columns.iter().any(|c| c.len() != ids.len()) {
            return Err(RagError::Corrupt(format!(
                "{prefix}*: postings of {} ids for {} terms came back short",
                ids.len(),
                terms.len()
            )));
        }
        Ok(columns)
    }

    async fn frequencies(&self, tenant: &str, terms: &[String]) -> Result<Frequencies, RagError> {
        let stats = self.key(tenant, "stats");
        let prefix = self.key(tenant, "term:");
        let mut call = ScriptCall::new(&self.frequencies, 1 + terms.len());
        call.key(&stats);
        for t in terms {
            call.key_joined(&[&prefix, t]);
        }
        let mut raw: Vec<redis::Value> = call
            .invoke(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let bad = |what: &str, e: redis::ParsingError| {
            RagError::Corrupt(format!("{what}: unexpected reply ({e})"))
        };
        let indexed = raw.len() == terms.len() + 2;
        if !indexed && raw.len() != 2 {
            return Err(RagError::Corrupt(format!(
                "{stats}: {} replies for {} terms",
                raw.len(),
                terms.len()
            )));
        }
        let lens = if indexed {
            raw.split_off(2)
        } else {
            vec![redis::Value::Int(0); terms.len()]
        };
        let number = |v: redis::Value| -> Result<Option<i64>, RagError> {
            redis::FromRedisValue::from_redis_value(v).map_err(|e| bad(&stats, e))
        };
        let mut two = raw.into_iter();
        let chunks = two.next().map(number).transpose()?.flatten();
        let tokens = two.next().map(number).transpose()?.flatten();
        let df = lens
            .into_iter()
            .zip(terms)
            .map(|(v, t)| {
                <u64 as redis::FromRedisValue>::from_redis_value(v)
                    .map_err(|e| bad(&format!("{prefix}{t}"), e))
            })
            .collect::<Result<_, _>>()?;
        let n = |v: Option<i64>| u64::try_from(v.unwrap_or(0)).unwrap_or(0);
        Ok(Frequencies {
            chunks: n(chunks),
            tokens: n(tokens),
            df,
        })
    }

    async fn metas(
        &self,
        tenant: &str,
        ids: &[String],
    ) -> Result<Vec<Option<ChunkMeta>>, RagError> {
        self.hmget(&self.key(tenant, "meta"), ids).await
    }

    async fn chunks(&self, tenant: &str, ids: &[String]) -> Result<Vec<Option<Chunk>>, RagError> {
        let entries: Vec<Option<Entry>> = self.hmget(&self.key(tenant, "chunk"), ids).await?;
        Ok(entries.into_iter().map(|e| e.map(|e| e.chunk)).collect())
    }
}
