//! Reading the figures guests print on their console, lines such as
//! `testguest: staged phase 8000 requests in 12 ms, 666666 requests/s`.

/// The value after `key` in `line`, up to a space or comma, parsed as `T`;
/// `None` when `key` is absent or the value does not parse. `key` is
/// matched as text (include its trailing space: `"ms, "`, `"steals "`).
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split([' ', ',']).find(|w| !w.is_empty())?.parse().ok()
}

/// The value of the word after the whole word `key` in a line of
/// space-separated words (`requests 12 exits 3`), the first occurrence of
/// `key` followed by a value that parses as `T`.
pub fn word_field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == key)
        .find_map(|w| w[1].parse().ok())
}

/// The first number after `key` in `line` (digits and a decimal point),
/// whatever stands between them; `None` when `key` or a number is missing.
pub fn number_after(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit() && c != '.')
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// Every unsigned integer in `line`, in order (runs of ASCII digits).
///
/// # Panics
/// On a run of digits that overflows `u64`.
pub fn numbers(line: &str) -> Vec<u64> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}

/// The first line of `text` starting with `prefix`.
pub fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_reads_the_value_after_its_key() {
        let l = "testguest: staged phase 8000 requests in 12 ms, 666666 requests/s";
        assert_eq!(field::<f64>(l, "ms, "), Some(666_666.0));
        assert_eq!(
            field::<u64>("testguest: migrations 7, fallbacks 0", "migrations "),
            Some(7)
        );
        assert_eq!(field::<u64>(l, "absent "), None);
        let idle = "testguest: idle waits 3, wakes sent 2, idle 12.5 % of the vCPUs' time";
        assert_eq!(field::<f64>(idle, ", idle "), Some(12.5));
        let steady = "testguest: steady phase 6400 requests in 8 ms, 800000 requests/s (from 10 % to 90 % of 8000)";
        assert_eq!(field::<f64>(steady, "ms, "), Some(800_000.0));
        let wc = "testguest: work-conserving steals 12, spills 3";
        assert_eq!(field::<u64>(wc, "steals "), Some(12));
        assert_eq!(field::<u64>(wc, "spills "), Some(3));
    }

    #[test]
    fn word_field_matches_whole_words_only() {
        let l = "count enter0 5 enter1 6 exits 7 errors 0";
        assert_eq!(word_field::<u64>(l, "enter1"), Some(6));
        assert_eq!(word_field::<u64>(l, "exit"), None);
        assert_eq!(word_field::<u64>("a b 3 a 4", "a"), Some(4));
    }

    #[test]
    fn numbers_and_number_after() {
        assert_eq!(numbers("vcpu 1: ring 2, iters 30"), [1, 2, 30]);
        let l = "testguest: net sink 1000 frames, 64000 bytes in 1234.5 ns";
        assert_eq!(number_after(l, "net sink "), Some(1000.0));
        assert_eq!(number_after(l, " bytes in "), Some(1234.5));
        assert_eq!(number_after(l, "absent"), None);
        assert_eq!(line("a 1\nb 2\n", "b"), Some("b 2"));
    }
}
