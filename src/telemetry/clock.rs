//! The log line's time: UTC, RFC 3339 with microseconds (`2026-11-29T23:00:00.000001Z`), the
//! text tracing-subscriber's `SystemTime` writes, put together digit by digit instead of
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

/// `since_epoch` as `YYYY-MM-DDTHH:MM:SS.ffffffZ`; `None` past the year 9999.
pub(super) fn stamp(since_epoch: Duration) -> Option<[u8; 27]> {
    let secs = since_epoch.as_secs();
    let (year, month, day) = civil_date(secs / 86_400);
    if year > 9999 {
        return None;
    }
    let of_day = secs % 86_400;
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    digits(&mut text[0..4], year);
    digits(&mut text[5..7], month);
    digits(&mut text[8..10], day);
    digits(&mut text[11..13], of_day / 3600);
    digits(&mut text[14..16], of_day % 3600 / 60);
    digits(&mut text[17..19], of_day % 60);
    digits(&mut text[20..26], u64::from(since_epoch.subsec_micros()));
    Some(text)
}

/// Writes `value`'s last `into.len()` decimal digits into `into`, zero-padded.
fn digits(into: &mut [u8], mut value: u64) {
    for place in into.iter_mut().rev() {
        // `value % 10` is below 10: the cast keeps it whole.
        *place = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// The proleptic Gregorian (year, month, day) of the day `days` after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_date(days: u64) -> (u64, u64, u64) {
    // Count from 0000-03-01, so that a leap day is the last day of its 400-year era's year.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
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
    fn every_day_of_four_centuries_follows_the_one_before() {
        // 1970-01-01 .. 2370-01-01: days and months roll over where the calendar says.
        let month_days = |y: u64, m: u64| match m {
            2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let (mut y, mut m, mut d) = (1970, 1, 1);
        for day in 0..146_097 {
            assert_eq!(super::civil_date(day), (y, m, d), "day {day}");
            d += 1;
            if d > month_days(y, m) {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
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
