//! Byte sizes on the command line: `47185920`, `45MiB`, `45M`, `1GiB`, `500kB`. Human output
//! shows sizes as `cli_support::progress::bytes` (`45.00 MiB`) and times as
//! `cli_support::time::rfc3339` (`2026-12-02T19:04:55Z`); `--json` keeps bytes and Unix seconds.

/// Parse a size in bytes, with an optional binary (`KiB`, `MiB`, `GiB`, or `K`/`M`/`G`) or
/// decimal (`kB`, `MB`, `GB`) unit. `B` alone means bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{text:?} is not a size; use bytes (47185920) or a unit (45MiB)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?}: number too large"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "M" | "MiB" | "Mi" => 1 << 20,
        "G" | "GiB" | "Gi" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; use B, KiB, MiB, GiB, kB, MB or GB"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{text:?}: size too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("47185920"), Ok(47_185_920));
        assert_eq!(parse_size("45MiB"), Ok(47_185_920));
        assert_eq!(parse_size("45M"), Ok(47_185_920));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("5kB"), Ok(5000));
        assert_eq!(parse_size("7B"), Ok(7));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }
}
