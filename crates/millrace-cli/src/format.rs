//! Human-facing numbers and tables.

use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};

pub fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("'{s}' is not a size ({e}); write it like 4096, 64k, 2G or 1.5T"))
}

pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.iter().map(|h| h.to_string()));
    t
}

/// A bar for a job that reports how far it is (a rebuild, a scrub, a bench).
pub fn progress_bar(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{percent:>3}}% eta {{eta}}"
        ))
        .unwrap(),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64k").unwrap(), 65536);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("12345").unwrap(), 12345);
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert_eq!(human(65536), "64 KiB");
        assert_eq!(human(1536), "1.50 KiB");
    }
}
