//! A script call written straight into the one `EVALSHA` command that is sent: each key and
//! argument goes into the command's buffer as it is given, a JSON value is serialised into it
//! in place, and nothing is copied again. (redis-rs's `ScriptInvocation` keeps every key and
//! argument in a vector of its own, then copies them all into the command it builds: an
//! allocation and two copies per argument, and the record's JSON text made first as a string
//! of its own.) A server that does not hold the script (`NOSCRIPT`: restarted, failed over,
//! flushed) gets it loaded and the same command sent again, as `invoke_async` does.

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, RedisWrite, Script, ToRedisArgs};

use super::super::StoreError;

/// The room a call's command starts with: its name, the script's digest and a dozen keys.
const ROOM: usize = 1024;
/// The arguments a call's command has room for at first, beside its name, the script's
/// digest, the key count and the keys.
const ARGS: usize = 12;

/// One call of a script: its keys first ([`ScriptCall::key`]), as many as it was made for,
/// then its arguments.
pub struct ScriptCall<'s> {
    script: &'s Script,
    cmd: Cmd,
    /// The keys the call was made for.
    keys: usize,
    /// The keys given so far.
    keys_given: usize,
    /// Whether an argument came before the last key.
    arg_too_early: bool,
}

impl<'s> ScriptCall<'s> {
    /// A call of `script` with `keys` keys.
    pub fn new(script: &'s Script, keys: usize) -> Self {
        Self::with_room(script, keys, ROOM)
    }

    /// A call of `script` with `keys` keys whose keys and arguments take about `bytes`: the
    /// command's buffer is made that large at once instead of doubling its way there (each
    /// time a copy of all written so far).
    pub fn with_room(script: &'s Script, keys: usize, bytes: usize) -> Self {
        let mut cmd = Cmd::with_capacity(3 + keys + ARGS, bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self {
            script,
            cmd,
            keys,
            keys_given: 0,
            arg_too_early: false,
        }
    }

    /// The next key (`KEYS[i]`).
    pub fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys_given += 1;
        self.cmd.arg(key);
        self
    }

    /// The next argument (`ARGV[i]`).
    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.note_arg();
        self.cmd.arg(arg);
        self
    }

    /// The next key, `parts` written one after another (no string of its own made first).
    pub fn key_joined(&mut self, parts: &[&str]) -> &mut Self {
        self.keys_given += 1;
        self.write_joined(parts)
    }

    /// The next argument, `parts` written one after another.
    pub fn arg_joined(&mut self, parts: &[&str]) -> &mut Self {
        self.note_arg();
        self.write_joined(parts)
    }

    /// Notes an argument given: one given before the last key makes the call refused.
    fn note_arg(&mut self) {
        self.arg_too_early |= self.keys_given != self.keys;
    }

    fn write_joined(&mut self, parts: &[&str]) -> &mut Self {
        {
            let mut out = self.cmd.writer_for_next_arg();
            for part in parts {
                // Writing to a command's buffer cannot fail (it grows a vector).
                let _ = std::io::Write::write_all(&mut out, part.as_bytes());
            }
        }
        self
    }

    /// The next argument, `value` as JSON serialised into the command.
    pub fn arg_json<T: serde::Serialize>(&mut self, value: &T) -> Result<&mut Self, StoreError> {
        self.note_arg();
        serde_json::to_writer(self.cmd.writer_for_next_arg(), value).map_err(StoreError::Encode)?;
        Ok(self)
    }

    /// The next argument: the JSON object `value` with one more member, `name` (a plain
    /// identifier) holding `items` as an array, written ahead of `value`'s own members — so
    /// the member is added without a copy of `value`'s JSON made to put it in.
    pub fn arg_json_with<T: serde::Serialize, I: serde::Serialize>(
        &mut self,
        value: &T,
        name: &str,
        items: &[I],
    ) -> Result<&mut Self, StoreError> {
        self.note_arg();
        {
            let mut out = self.cmd.writer_for_next_arg();
            for part in ["{\"", name, "\":"] {
                // Writing to a command's buffer cannot fail (it grows a vector).
                let _ = std::io::Write::write_all(&mut out, part.as_bytes());
            }
            serde_json::to_writer(&mut out, items).map_err(StoreError::Encode)?;
            let members = ObjectMembers {
                out: &mut out,
                opened: false,
                first: true,
            };
            serde_json::to_writer(members, value).map_err(StoreError::Encode)?;
        }
        Ok(self)
    }

    /// Sends the call; loads the script and sends it again if the server does not hold it.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        // A key too many would reach the script as its first argument, an argument too
        // early as a key: either way it would read the wrong values, so nothing is sent.
        if self.keys_given != self.keys || self.arg_too_early {
            return Err((
                ErrorKind::Client,
                "a script call whose keys do not match the count it declared",
                format!(
                    "declared {}, given {}{}",
                    self.keys,
                    self.keys_given,
                    if self.arg_too_early {
                        ", an argument before the last key"
                    } else {
                        ""
                    }
                ),
            )
                .into());
        }
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}

/// Writes a JSON object's members after members written already: drops its opening brace and
/// puts a comma before its first member (none for an empty object, whose closing brace
/// follows at once). Anything but an object is refused.
struct ObjectMembers<'w, W: std::io::Write> {
    out: &'w mut W,
    /// The opening brace was seen.
    opened: bool,
    /// No byte after the brace was written yet.
    first: bool,
}

impl<W: std::io::Write> std::io::Write for ObjectMembers<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    /// Each of the serialiser's tokens comes here: past the first, straight through.
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if !self.first {
            return self.out.write_all(buf);
        }
        let mut rest = buf;
        if !self.opened {
            let Some((&b'{', after)) = rest.split_first() else {
                return Err(std::io::Error::other("not a JSON object"));
            };
            self.opened = true;
            rest = after;
        }
        if let Some(&next) = rest.first() {
            self.first = false;
            if next != b'}' {
                self.out.write_all(b",")?;
            }
        }
        self.out.write_all(rest)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last argument of `call`, as text.
    fn last_arg(call: &ScriptCall<'_>) -> String {
        let last = call.cmd.args_iter().last();
        match last {
            Some(redis::Arg::Simple(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            other => panic!("no simple argument: {other:?}"),
        }
    }

    #[test]
    fn an_object_gets_its_member_ahead_of_its_own_and_anything_else_is_refused() {
        let script = Script::new("return 1");
        let items = [serde_json::json!({"role": "user"}), serde_json::json!(2)];
        let mut call = ScriptCall::new(&script, 0);
        call.arg_json_with(
            &serde_json::json!({"a": 1, "b": [true]}),
            "conversation",
            &items,
        )
        .expect("an object");
        let text = last_arg(&call);
        assert_eq!(
            text,
            r#"{"conversation":[{"role":"user"},2],"a":1,"b":[true]}"#
        );
        let read: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(read["conversation"][1], 2);

        let empty: [u8; 0] = [];
        call.arg_json_with(&serde_json::json!({}), "items", &empty)
            .expect("an empty object");
        assert_eq!(last_arg(&call), r#"{"items":[]}"#);

        let refused = call.arg_json_with(&[1, 2], "items", &empty).err();
        assert!(
            matches!(refused, Some(StoreError::Encode(_))),
            "{refused:?}"
        );
    }
}
