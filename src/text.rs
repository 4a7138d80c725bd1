//! Text for people: escaping untrusted strings, and sizes and counts in short form.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::{self, Write as _};

/// Escapes what a terminal could act on or what could disguise text: C0 and C1 control
/// characters (escape sequences among them), DEL, and the Unicode marks that reorder or hide text
/// (bidirectional overrides and isolates, zero-width characters, line separators, a BOM). Tensor
/// names and metadata come from whoever wrote the file, so everything shown passes through here.
pub fn escape(text: &str) -> Cow<'_, str> {
    let printable_ascii = text.bytes().all(|b| (0x20..0x7f).contains(&b));
    if printable_ascii || !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(escaped, "\\u{{{:x}}}", u32::from(c));
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

/// Escapes bytes that may not be UTF-8 (file names), showing invalid bytes as `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut escaped = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        escaped.push_str(&escape(chunk.valid()));
        for byte in chunk.invalid() {
            let _ = write!(escaped, "\\x{byte:02x}");
        }
    }
    escaped
}

/// A path for display: escaped, with invalid UTF-8 shown as `\xNN`.
pub fn escape_path(path: &std::path::Path) -> String {
    escape_bytes(path.as_os_str().as_encoded_bytes())
}

/// A character that [`escape`] shows escaped and that is not a C0 control (JSON escapes those
/// already): C1 controls, DEL, and the marks that reorder or hide text.
pub fn is_hazard(c: char) -> bool {
    needs_escape(c) && u32::from(c) >= 0x20
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// Case-insensitive substring test; `needle` must already be lowercase.
pub fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    if haystack.is_ascii() && needle.is_ascii() {
        needle.is_empty()
            || haystack
                .as_bytes()
                .windows(needle.len())
                .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
    } else {
        haystack.to_lowercase().contains(needle)
    }
}

/// Columns the text takes in a terminal (ASCII is counted without a table lookup).
pub fn display_width(text: &str) -> usize {
    if text.is_ascii() {
        text.len()
    } else {
        unicode_width::UnicodeWidthStr::width(text)
    }
}

/// A tensor's dotted name within `width` columns, for a column of names: whole where it fits;
/// otherwise without its `.weight` ending, then without a leading `model.`, which every name of
/// the column shares; then cut in the middle with `…`, keeping the start up to its first number
/// (the layer) where that leaves room, and as much of the end as fits.
pub fn fit_name(name: &str, width: usize) -> Cow<'_, str> {
    if display_width(name) <= width {
        return Cow::Borrowed(name);
    }
    let trimmed = name.strip_suffix(".weight").unwrap_or(name);
    if display_width(trimmed) <= width {
        return Cow::Borrowed(trimmed);
    }
    let trimmed = trimmed.strip_prefix("model.").unwrap_or(trimmed);
    if display_width(trimmed) <= width {
        return Cow::Borrowed(trimmed);
    }
    let room = width.saturating_sub(1);
    let through_number = trimmed
        .split_inclusive('.')
        .scan(0, |end, part| {
            *end += part.len();
            Some((*end, is_numeric_part(part.trim_end_matches('.'))))
        })
        .find(|&(_, numeric)| numeric)
        .map(|(end, _)| end);
    let head_len = match through_number {
        Some(end) if display_width(&trimmed[..end]) <= room / 2 => end,
        _ => prefix_within(trimmed, room / 3),
    };
    let head = &trimmed[..head_len];
    let tail_room = room - display_width(head);
    let tail_start = trimmed
        .char_indices()
        .map(|(at, _)| at)
        .find(|&at| at >= head_len && display_width(&trimmed[at..]) <= tail_room)
        .unwrap_or(trimmed.len());
    Cow::Owned(format!("{head}…{}", &trimmed[tail_start..]))
}

/// The length in bytes of the longest prefix of `text` within `width` columns.
fn prefix_within(text: &str, width: usize) -> usize {
    text.char_indices()
        .map(|(at, c)| at + c.len_utf8())
        .take_while(|&end| display_width(&text[..end]) <= width)
        .last()
        .unwrap_or(0)
}

/// A byte count in binary units: `512 B`, `4.00 KiB`, `1.50 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    Bytes(bytes).to_string()
}

/// A count with a decimal suffix: `950`, `12.3 K`, `1.10 B` (billions, as parameter counts go).
pub fn format_count(count: u64) -> String {
    Count(count).to_string()
}

/// Shows a byte count as [`format_bytes`] does, without allocating.
#[derive(Clone, Copy, Debug)]
pub struct Bytes(pub u64);

/// Shows a count as [`format_count`] does, without allocating.
#[derive(Clone, Copy, Debug)]
pub struct Count(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut scale = 1024u128;
        let mut unit = 0;
        while u128::from(self.0) >= scale * 1024 && unit + 1 < UNITS.len() {
            scale *= 1024;
            unit += 1;
        }
        write_three_digits(f, u128::from(self.0), scale, UNITS[unit])
    }
}

/// A number of things with their noun, plural but for one: `1 tensor`, `3 tensors`.
#[derive(Clone, Copy, Debug)]
pub struct Counted<'a, T>(pub T, pub &'a str);

impl<T: fmt::Display + PartialEq + From<u8>> fmt::Display for Counted<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Counted(count, noun) = self;
        let plural = if *count == T::from(1) { "" } else { "s" };
        write!(f, "{count} {noun}{plural}")
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["K", "M", "B", "T", "P", "E"];
        if self.0 < 1000 {
            return write!(f, "{}", self.0);
        }
        let mut scale = 1000u128;
        let mut unit = 0;
        // Values that would round up to 1000 of a unit move to the next unit.
        while u128::from(self.0) * 100 >= scale * 99_995 && unit + 1 < UNITS.len() {
            scale *= 1000;
            unit += 1;
        }
        write_three_digits(f, u128::from(self.0), scale, UNITS[unit])
    }
}

/// Shows a shape as `[2, 3]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape<'a>(pub &'a crate::format::Shape);

impl fmt::Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, dim) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{dim}")?;
        }
        f.write_str("]")
    }
}

/// Whether a part of a dotted name is a number (`12` in `model.layers.12.mlp`): digits only.
pub fn is_numeric_part(part: &str) -> bool {
    !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit())
}

/// `names` in backticks, escaped, the first `shown` of them and how many more (all of them when
/// only one more would be left: its name is as short as "and 1 more").
pub fn listed_in_backticks<S: AsRef<str>>(names: &[S], shown: usize) -> String {
    let shown = if names.len() == shown + 1 {
        names.len()
    } else {
        shown
    };
    let first: Vec<String> = names
        .iter()
        .take(shown)
        .map(|n| format!("`{}`", escape(n.as_ref())))
        .collect();
    match names.len().saturating_sub(shown) {
        0 => first.join(", "),
        more => format!("{} and {more} more", first.join(", ")),
    }
}

/// Orders names as people read them: runs of digits compare as numbers, so `layers.2` comes
/// before `layers.10`. Equal numbers with different leading zeros fall back to byte order.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (a_bytes, b_bytes) = (a.as_bytes(), b.as_bytes());
    // Names share long prefixes; skip the common part, backing up into a digit run it ends in.
    let mut start = common_prefix_len(a_bytes, b_bytes);
    while start > 0 && a_bytes[start - 1].is_ascii_digit() {
        start -= 1;
    }
    let (mut a_rest, mut b_rest) = (&a_bytes[start..], &b_bytes[start..]);
    loop {
        match (a_rest.first(), b_rest.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (a_digits, a_tail) = split_digits(a_rest);
                let (b_digits, b_tail) = split_digits(b_rest);
                let a_number = trim_zeros(a_digits);
                let b_number = trim_zeros(b_digits);
                let order = a_number
                    .len()
                    .cmp(&b_number.len())
                    .then_with(|| a_number.cmp(b_number));
                if order != Ordering::Equal {
                    return order;
                }
                (a_rest, b_rest) = (a_tail, b_tail);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a_rest, b_rest) = (&a_rest[1..], &b_rest[1..]);
            }
        }
    }
}

/// How many leading bytes `a` and `b` share.
pub fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    // Eight bytes at a time, the first differing byte found from the lowest set bit of their
    // difference: tensor names share long prefixes, and this is the inner loop of sorting them.
    const WORD: usize = 8;
    let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().unwrap_or_default());
    let mut shared = 0;
    for (x, y) in a.chunks_exact(WORD).zip(b.chunks_exact(WORD)) {
        let difference = word(x) ^ word(y);
        if difference != 0 {
            return shared + difference.trailing_zeros() as usize / 8;
        }
        shared += WORD;
    }
    shared
        + a[shared..]
            .iter()
            .zip(&b[shared..])
            .take_while(|(x, y)| x == y)
            .count()
}

/// Byte order, as `Ord` for `[u8]` gives it, found past the prefix the two share a word at a
/// time rather than through `memcmp`: tensor names share long prefixes, and sorting them is
/// where a large index or a quantized checkpoint's members spend their time.
pub fn byte_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let common = common_prefix_len(a, b);
    a.get(common).cmp(&b.get(common))
}

fn split_digits(bytes: &[u8]) -> (&[u8], &[u8]) {
    let end = bytes
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(bytes.len());
    bytes.split_at(end)
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let start = digits
        .iter()
        .position(|&b| b != b'0')
        .unwrap_or(digits.len());
    &digits[start..]
}

/// `value / scale` to three significant digits (`1.23`, `12.3`, `123`), then the unit; integer
/// arithmetic, rounding half up.
fn write_three_digits(
    f: &mut fmt::Formatter<'_>,
    value: u128,
    scale: u128,
    unit: &str,
) -> fmt::Result {
    let rounded = |per_unit: u128| (value * per_unit * 2 + scale) / (scale * 2);
    let hundredths = rounded(100);
    if hundredths >= 9_995 {
        write!(f, "{} {unit}", rounded(1))
    } else if hundredths >= 1_000 {
        let tenths = rounded(10);
        write!(f, "{}.{} {unit}", tenths / 10, tenths % 10)
    } else {
        write!(f, "{}.{:02} {unit}", hundredths / 100, hundredths % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_count_of_one_is_singular() {
        assert_eq!(Counted(1, "tensor").to_string(), "1 tensor");
        assert_eq!(Counted(0, "tensor").to_string(), "0 tensors");
        assert_eq!(Counted(3, "finding").to_string(), "3 findings");
    }

    #[test]
    fn names_fit_their_column_keeping_the_layer_and_the_end() {
        let name = "model.layers.3.self_attn.k_proj.weight";
        assert_eq!(fit_name(name, 40), name);
        assert_eq!(fit_name(name, 31), "model.layers.3.self_attn.k_proj");
        assert_eq!(fit_name(name, 25), "layers.3.self_attn.k_proj");
        assert_eq!(fit_name(name, 22), "layers.3.…_attn.k_proj");
        let expert = "model.layers.47.mlp.experts.127.down_proj.weight";
        assert_eq!(fit_name(expert, 22), "layers.47.…7.down_proj");
        // No number near the start: a third of the room for the start.
        let long = "vision_tower.encoder.attention_projection_output";
        assert_eq!(fit_name(long, 16), "visio…ion_output");
        for width in 0..60 {
            for name in [name, expert, long, "blocks.0.ç.weight", "x"] {
                let fitted = fit_name(name, width);
                assert!(
                    display_width(&fitted) <= width.max(1) || fitted == name,
                    "{name} at {width}: {fitted}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn common_prefix_len_counts_the_bytes_shared(a in prop::collection::vec(0u8..3, 0..40),
                                                    b in prop::collection::vec(0u8..3, 0..40)) {
            let expected = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(common_prefix_len(&a, &b), expected);
            prop_assert_eq!(byte_order(&a, &b), a.cmp(&b));
        }
    }

    #[test]
    fn escapes_terminal_controls_and_reordering_marks() {
        assert_eq!(escape("model.layers.0"), "model.layers.0");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(escape("a\u{1b}[31mred"), "a\\u{1b}[31mred");
        assert_eq!(escape("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
        assert_eq!(escape("tab\there\n"), "tab\\there\\n");
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape("日本語.weight"), "日本語.weight");
        assert_eq!(escape_bytes(b"ok\xffname"), "ok\\xffname");
    }

    #[test]
    fn natural_order_compares_numbers_as_numbers() {
        let mut names = vec![
            "layers.10.w",
            "layers.2.w",
            "layers.1.w",
            "layers.02.w",
            "embed",
            "layers.b",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "embed",
                "layers.1.w",
                "layers.02.w",
                "layers.2.w",
                "layers.10.w",
                "layers.b"
            ]
        );
        assert_eq!(
            natural_cmp("a99999999999999999999999", "a100000000000000000000000"),
            Ordering::Less
        );
        assert_eq!(natural_cmp("x", "x"), Ordering::Equal);
        assert_eq!(natural_cmp("l.12a", "l.12b"), Ordering::Less);
        assert_eq!(natural_cmp("l.19", "l.123"), Ordering::Less);
        assert_eq!(natural_cmp("l.123", "l.19"), Ordering::Greater);
        assert_eq!(natural_cmp("l.007", "l.7"), Ordering::Less);
    }

    #[test]
    fn sizes_and_counts_read_well() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(2_200_000_000), "2.05 GiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1_100_048_384), "1.10 B");
        assert_eq!(format_count(65_536_000), "65.5 M");
        assert_eq!(format_count(999_999), "1.00 M");
    }
}
