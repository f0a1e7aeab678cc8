//! Download progress as both binaries draw it on a terminal: `LABEL [=====>    ] DONE/TOTAL
//! RATE eta ETA`, sizes in binary units (`1.50 MiB`), the ETA in its largest sensible unit
//! (`42s`, `3m`). `release-cli` draws its bars with this template through indicatif;
//! `device-modeld-manager` (no indicatif: the device binary has a size budget) draws the same
//! line with [`bytes_line`]. The formats are checked against indicatif's in the tests.

use std::io::IsTerminal;
use std::time::Duration;

/// The template of a byte-count bar, in indicatif's syntax (`release-cli`).
pub const BYTES_TEMPLATE: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";

/// The bar's filled, head and empty characters (indicatif's `progress_chars`).
pub const BAR_CHARS: &str = "=> ";

/// The bar's width in characters.
const BAR_WIDTH: u64 = 30;

/// Whether progress bars would only be noise: `--json`, `-q`, or stderr is not a terminal.
pub fn bars_hidden(json: bool) -> bool {
    json || crate::verbosity() == crate::Verbosity::Quiet || !std::io::stderr().is_terminal()
}

/// A byte count in binary units: `512 B`, `1.00 KiB`, `45.00 MiB`.
pub fn bytes(n: u64) -> String {
    const PREFIXES: [&str; 8] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut prefix = 0;
    while value >= 1024.0 && prefix + 1 < PREFIXES.len() {
        value /= 1024.0;
        prefix += 1;
    }
    format!("{value:.2} {}B", PREFIXES[prefix])
}

/// A duration in the largest unit (y, w, d, h, m, s) it holds at least one and a half of (after
/// rounding to half the next smaller unit), rounded to whole units, at least 2 of any unit but
/// seconds: `0s`, `89s`, `2m`, `3h`.
pub fn duration(d: Duration) -> String {
    const UNITS: [(u64, &str); 6] = [
        (365 * 24 * 3600, "y"),
        (7 * 24 * 3600, "w"),
        (24 * 3600, "d"),
        (3600, "h"),
        (60, "m"),
        (1, "s"),
    ];
    for pair in UNITS.windows(2) {
        let [(unit, name), (smaller, _)] = pair else {
            unreachable!("windows of 2")
        };
        // d + smaller/2 >= 1.5 unit, in whole nanoseconds.
        if 2 * d.as_nanos() + u128::from(*smaller) * 1_000_000_000
            >= 3 * u128::from(*unit) * 1_000_000_000
        {
            let n = (d.as_secs_f64() / *unit as f64).round().max(2.0);
            return format!("{n}{name}");
        }
    }
    format!("{}s", d.as_secs_f64().round())
}

/// The bar for `done` of `total`: [`BAR_CHARS`] over 30 columns.
pub fn bar(done: u64, total: u64) -> String {
    let filled = match total {
        0 => BAR_WIDTH,
        t => u64::try_from(u128::from(done.min(t)) * u128::from(BAR_WIDTH) / u128::from(t))
            .unwrap_or(BAR_WIDTH),
    };
    let head = u64::from(filled < BAR_WIDTH && done > 0);
    format!(
        "{}{}{}",
        "=".repeat(filled as usize),
        ">".repeat(head as usize),
        " ".repeat((BAR_WIDTH - filled - head) as usize)
    )
}

/// One bar line of [`BYTES_TEMPLATE`]: `label`, `done` of `total` bytes, and the rate and ETA of
/// `moved` bytes in `elapsed` (what this run fetched; a resumed download starts past zero).
pub fn bytes_line(label: &str, done: u64, total: u64, moved: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { moved as f64 / secs } else { 0.0 };
    let eta = match rate > 0.0 {
        true => Duration::from_secs_f64(total.saturating_sub(done) as f64 / rate),
        false => Duration::ZERO,
    };
    format!(
        "{label} [{}] {}/{} {}/s eta {}",
        bar(done, total),
        bytes(done),
        bytes(total),
        bytes(rate as u64),
        duration(eta)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's terminal line says what release-cli's indicatif bars say.
    #[test]
    fn units_are_the_release_cli_bars() {
        for n in [
            0,
            1,
            1023,
            1024,
            1536,
            1024 * 1024 - 1,
            1024 * 1024,
            47_185_920,
            (1 << 30) + 5,
            u64::MAX,
        ] {
            assert_eq!(bytes(n), indicatif::HumanBytes(n).to_string(), "{n}");
        }
        for secs in [
            0.0, 0.4, 0.6, 1.0, 44.5, 89.0, 89.4, 89.5, 90.0, 150.0, 5399.0, 5400.0, 86_400.0,
            129_599.0, 129_600.0, 1e6, 1e9,
        ] {
            let d = Duration::from_secs_f64(secs);
            assert_eq!(
                duration(d),
                format!("{:#}", indicatif::HumanDuration(d)),
                "{secs}"
            );
        }
    }

    #[test]
    fn bars_and_lines() {
        assert_eq!(bar(0, 100), " ".repeat(30));
        assert_eq!(bar(1, 100), format!(">{}", " ".repeat(29)));
        assert_eq!(
            bar(50, 100),
            format!("{}>{}", "=".repeat(15), " ".repeat(14))
        );
        assert_eq!(bar(100, 100), "=".repeat(30));
        assert_eq!(bar(7, 0), "=".repeat(30), "an empty download is complete");
        assert_eq!(
            bytes_line("pop223", 3 << 20, 4 << 20, 2 << 20, Duration::from_secs(2)),
            format!(
                "pop223 [{}>{}] 3.00 MiB/4.00 MiB 1.00 MiB/s eta 1s",
                "=".repeat(22),
                " ".repeat(7)
            )
        );
        assert!(
            bytes_line("x", 0, 10, 0, Duration::ZERO).ends_with("0 B/10 B 0 B/s eta 0s"),
            "no rate yet: no ETA"
        );
    }
}
