use std::time::Duration;

/// The fields of `INFO server` that restart detection needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub run_id: String,
    pub uptime: Duration,
}

pub(crate) fn parse_server_info(text: &str) -> Result<ServerInfo, String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let run_id = field("run_id").ok_or("INFO server has no run_id")?.to_owned();
    let uptime = field("uptime_in_seconds")
        .ok_or("INFO server has no uptime_in_seconds")?
        .parse::<u64>()
        .map_err(|err| format!("bad uptime_in_seconds: {err}"))?;
    Ok(ServerInfo {
        run_id,
        uptime: Duration::from_secs(uptime),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fields_restart_detection_needs() {
        let text = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n";
        let info = parse_server_info(text).unwrap();
        assert_eq!(info.run_id, "abc123");
        assert_eq!(info.uptime, Duration::from_secs(42));
        assert!(parse_server_info("# Server\r\nrun_id:x\r\n").is_err());
    }
}
