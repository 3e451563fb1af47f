//! Lowercase hexadecimal text of bytes: content hashes, fingerprints, trace ids.
//!
//! Owns: the encoding. Must not: hash or generate (callers bring the bytes).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex, two digits per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::lower;

    #[test]
    fn each_byte_is_two_lowercase_digits_as_format_writes_them() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(lower(&all), expected);
        assert_eq!(lower(&[]), "");
        assert_eq!(lower(&[0x0a, 0xf0]), "0af0");
    }
}
