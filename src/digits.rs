//! Decimal text of fixed width, written digit by digit rather than through `format!`'s padded
//! integer formats: the log line's time, the UTC day a model call's spending counts under.
//!
//! Owns: the digits. Must not: read a clock (callers bring the values).

/// Writes `value`'s last `into.len()` decimal digits into `into`, zero-padded.
pub fn write(into: &mut [u8], mut value: u64) {
    for place in into.iter_mut().rev() {
        // `value % 10` is below 10: the cast keeps it whole.
        *place = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// `day` as `YYYY-MM-DD`; `None` for a year before 0 or after 9999, which four digits do not
/// hold.
pub fn date(day: time::Date) -> Option<[u8; 10]> {
    let year = u64::try_from(day.year()).ok().filter(|y| *y <= 9999)?;
    let mut text = *b"0000-00-00";
    write(&mut text[0..4], year);
    write(&mut text[5..7], u64::from(u8::from(day.month())));
    write(&mut text[8..10], u64::from(day.day()));
    Some(text)
}

#[cfg(test)]
mod tests {
    /// The text is `format!`'s for every day of the years the product will see, the turns of
    /// centuries and leap days among them, and for the ends of the four-digit years; none
    /// outside them.
    #[test]
    fn a_date_is_year_month_day_as_format_writes_it() {
        for year in (0..=3).chain(1999..=2101).chain(9998..=9999) {
            let mut day = time::Date::from_ordinal_date(year, 1).expect("a year's first day");
            while day.year() == year {
                let expected = format!(
                    "{:04}-{:02}-{:02}",
                    day.year(),
                    u8::from(day.month()),
                    day.day()
                );
                let text = super::date(day).expect("four digits");
                assert_eq!(std::str::from_utf8(&text), Ok(expected.as_str()));
                let Some(next) = day.next_day() else { break };
                day = next;
            }
        }
        let before_year_0 = time::Date::from_ordinal_date(-1, 365).expect("a day");
        assert_eq!(super::date(before_year_0), None);
    }

    #[test]
    fn fields_are_zero_padded_and_keep_their_last_digits() {
        let mut field = [0_u8; 6];
        super::write(&mut field, 42);
        assert_eq!(&field, b"000042");
        super::write(&mut field[..2], 1_234);
        assert_eq!(&field[..2], b"34");
    }
}
