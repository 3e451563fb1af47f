//! The log line's time: UTC, RFC 3339 with microseconds (`2026-11-29T23:00:00.000001Z`), the
//! text tracing-subscriber's `SystemTime` writes, its digits put in place instead of written
//! through seven padded integer formats. A time it cannot write that way (before 1970, after
//! 9999) is left to tracing-subscriber's clock.

use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// The wall clock, written as UTC.
#[derive(Debug, Default, Clone, Copy)]
pub struct UtcClock;

impl FormatTime for UtcClock {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let stamp = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(stamp);
        match stamp {
            Some(text) => w.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?),
            None => SystemTime.format_time(w),
        }
    }
}

/// `since_epoch` as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (the calendar is the `time` crate's); `None`
/// past the year 9999.
pub(super) fn stamp(since_epoch: Duration) -> Option<[u8; 27]> {
    let secs = i64::try_from(since_epoch.as_secs()).ok()?;
    let at = time::OffsetDateTime::from_unix_timestamp(secs).ok()?;
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    text[0..10].copy_from_slice(&crate::digits::date(at.date())?);
    let digits = crate::digits::write;
    digits(&mut text[11..13], u64::from(at.hour()));
    digits(&mut text[14..16], u64::from(at.minute()));
    digits(&mut text[17..19], u64::from(at.second()));
    digits(&mut text[20..26], u64::from(since_epoch.subsec_micros()));
    Some(text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

    use super::{UtcClock, stamp};

    fn at(secs: u64, micros: u32) -> String {
        let text = stamp(Duration::new(secs, micros * 1000)).expect("before 9999");
        String::from_utf8(text.to_vec()).expect("ascii")
    }

    #[test]
    fn known_instants() {
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 1), "2000-02-29T00:00:00.000001Z");
        assert_eq!(at(951_868_799, 999_999), "2000-02-29T23:59:59.999999Z");
        assert_eq!(at(4_107_542_399, 500_000), "2100-02-28T23:59:59.500000Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
        assert_eq!(at(1_795_993_200, 123_456), "2026-11-29T23:00:00.123456Z");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z");
        assert_eq!(stamp(Duration::from_secs(253_402_300_800)), None);
    }

    #[test]
    fn writes_what_tracing_subscribers_clock_writes() {
        let read = |clock: &dyn FormatTime| {
            let mut text = String::new();
            clock
                .format_time(&mut Writer::new(&mut text))
                .expect("the clock writes");
            text
        };
        // Compared to the second: a pair read across a second's turn is read again.
        for _ in 0..10 {
            let before = read(&SystemTime);
            let ours = read(&UtcClock);
            let after = read(&SystemTime);
            assert_eq!(ours.len(), before.len(), "{ours} vs {before}");
            if before[..19] == after[..19] {
                assert_eq!(ours[..19], before[..19]);
                assert!(ours.ends_with('Z') && ours.as_bytes()[19] == b'.', "{ours}");
                return;
            }
        }
        panic!("the clock's second kept turning");
    }
}
