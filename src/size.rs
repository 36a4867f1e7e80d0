//! Parsing of human memory sizes for `--vram-cap`: `900MB`, `1GiB`, `1.5G`, `834413138`.

/// Parse a size: a number (integer or decimal) followed by an optional unit. Decimal units
/// (`kB`/`KB`, `MB`, `GB`, `TB`) are powers of 1000; binary units (`KiB`, `MiB`, `GiB`, `TiB`) and the
/// bare letters `K`, `M`, `G`, `T` are powers of 1024 (as `nvidia-smi` and most GPU tools count). `B` or no
/// unit means bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    let unit = unit.trim();
    let help = "write a number with an optional unit, e.g. 900MB, 1GiB, 1.5G or 834413138";
    if num.is_empty() {
        return Err(format!(
            "`{s}` is not a size: it does not start with a number; {help}"
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size: `{num}` is not a number; {help}"))?;
    let mult: f64 = match unit {
        "" | "B" | "b" => 1.0,
        "kB" | "KB" | "kb" => 1e3,
        "MB" | "mb" => 1e6,
        "GB" | "gb" => 1e9,
        "TB" | "tb" => 1e12,
        "K" | "k" | "KiB" | "kiB" => 1024.0,
        "M" | "m" | "MiB" => 1024.0 * 1024.0,
        "G" | "g" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "t" | "TiB" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "`{s}` is not a size: unknown unit `{other}`; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB / K, M, G, T (powers of 1024)"
            ))
        }
    };
    let too_large =
        || format!("`{s}` is too large: a size must be below 2^64 bytes (16 EiB); {help}");
    // Whole numbers exactly (no f64 rounding of a 20-digit byte count).
    if !num.contains('.') {
        let n: u128 = num.parse().map_err(|_| too_large())?;
        let bytes = n.checked_mul(mult as u128).ok_or_else(too_large)?;
        if bytes == 0 {
            return Err(format!(
                "`{s}` is not a usable size: it must be at least 1 byte; {help}"
            ));
        }
        return u64::try_from(bytes).map_err(|_| too_large());
    }
    let bytes = value * mult;
    // 2^64 exactly: `u64::MAX as f64` rounds up to it, so compare with >=.
    if bytes.is_finite() && bytes >= 18_446_744_073_709_551_616.0 {
        return Err(too_large());
    }
    if !bytes.is_finite() || bytes.round() < 1.0 {
        return Err(format!(
            "`{s}` is not a usable size: it must be at least 1 byte; {help}"
        ));
    }
    Ok(bytes.round() as u64)
}

pub use dmc_compiler::report::human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_size("900MB"), Ok(900_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5G"), Ok(1_610_612_736));
        assert_eq!(parse_size("834413138"), Ok(834_413_138));
        assert_eq!(parse_size("840 MB"), Ok(840_000_000));
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("2_000B"), Ok(2_000));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("16777215TiB"), Ok(16_777_215 << 40));
    }

    #[test]
    fn rejects_malformed_sizes_with_a_reason() {
        for bad in [
            "",
            "MB",
            "1.2.3G",
            "12 parsecs",
            "-5MB",
            "0",
            "0.1B",
            "1e9",
            "18446744073709551616",
            "18446744073709551616.0",
            "99999999999999999999999999999999999999999",
            "16777216TiB",
            "20000000000TB",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("size"), "{bad}: {e}");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(826_152_612), "787.9 MiB");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1 << 30), "1.0 GiB");
    }
}
