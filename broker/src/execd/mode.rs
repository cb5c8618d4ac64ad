//! File modes as execd writes them: octal digits read as a decimal number
//! (0o755 is sent as 755). No dependency on the rest of the broker, so the
//! upload fuzz target (fuzz/) can include it with [`super::upload_parts`].

/// 0o755 → 755.
pub fn mode_to_wire(mode: u32) -> u64 {
    format!("{mode:o}").parse().unwrap_or(0)
}

/// The inverse: 755 → 0o755; digits above 7 are an error.
pub fn mode_from_wire(mode: u64) -> Result<u32, String> {
    u32::from_str_radix(&mode.to_string(), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("invalid mode {mode}: expected octal digits such as 644 or 755"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_as_octal_digits() {
        assert_eq!(mode_to_wire(0o755), 755);
        assert_eq!(mode_to_wire(0o4755), 4755);
        assert_eq!(mode_from_wire(644).unwrap(), 0o644);
        assert!(mode_from_wire(888).is_err());
        assert!(mode_from_wire(77777).is_err());
    }
}
