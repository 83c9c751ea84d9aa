use std::fmt;
use std::time::Duration;

use redis::IntoConnectionInfo;

/// One Redis master, as a `redis://` or `rediss://` URL that may carry a user and password.
///
/// The URL is kept whole for connecting; everything that is shown to people uses [`Endpoint::display`],
/// which never contains the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    url: String,
    display: String,
}

impl Endpoint {
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let raw = raw.trim();
        let invalid = |reason: &str| ConfigError::InvalidEndpoint {
            endpoint: redact(raw),
            reason: reason.to_owned(),
        };
        let scheme_end = raw
            .find("://")
            .ok_or_else(|| invalid("expected redis://HOST:PORT or rediss://HOST:PORT"))?;
        match &raw[..scheme_end] {
            "redis" | "rediss" => {}
            other => {
                return Err(invalid(&format!(
                    "unsupported scheme `{other}`, expected redis or rediss"
                )));
            }
        }
        if let Some((_, fragment)) = raw.split_once('#') {
            // The Redis client reads `#insecure` as "skip the certificate check": anyone on the path could then
            // answer for a master. No fragment is needed for anything else, so none is accepted.
            return Err(invalid(&if fragment == "insecure" {
                "#insecure would turn off the masters' certificate check; give the CA that signed them instead (`lock --redis-ca`, a quorum's spec.tls.caSecretName)".to_owned()
            } else {
                format!("unexpected #{fragment}: endpoint URLs take no fragment")
            }));
        }
        let rest = &raw[scheme_end + 3..];
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host = authority.rsplit('@').next().unwrap_or_default();
        if host.is_empty() || host.starts_with(':') {
            return Err(invalid("missing host"));
        }
        raw.into_connection_info()
            .map_err(|err| invalid(&err.to_string().replace(raw, "<url>")))?;
        Ok(Self {
            url: raw.to_owned(),
            display: redact(raw),
        })
    }

    /// The URL with any password replaced, for logs, status and errors.
    pub fn display(&self) -> &str {
        &self.display
    }

    pub fn is_tls(&self) -> bool {
        self.url.starts_with("rediss://")
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// Puts a user name and password into an endpoint URL, percent-encoded, so that passwords with `@`, `:` or `/`
/// work; with neither, the URL is returned as it is.
pub fn with_credentials(raw: &str, username: Option<&str>, password: Option<&str>) -> Result<String, String> {
    if username.is_none() && password.is_none() {
        return Ok(raw.to_owned());
    }
    let mut url = url::Url::parse(raw).map_err(|err| format!("endpoint {}: {err}", redact(raw)))?;
    // The URL standard's userinfo encoding leaves `%` alone (it may start an escape already made), and the
    // Redis client decodes every escape: a `%` of the credential itself is escaped first.
    if let Some(username) = username {
        url.set_username(&username.replace('%', "%25"))
            .map_err(|()| format!("endpoint {} cannot carry a user name", redact(raw)))?;
    }
    if let Some(password) = password {
        url.set_password(Some(&password.replace('%', "%25")))
            .map_err(|()| format!("endpoint {} cannot carry a password", redact(raw)))?;
    }
    Ok(url.to_string())
}

/// Replaces a URL's userinfo (`user:password@` or `:password@`) with `***`: the password, and the user name
/// too, which names an ACL user of the masters and is as private as the Secret it came from.
fn redact(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return raw.to_owned();
    };
    let authority_start = scheme_end + 3;
    // The last `@` of the whole URL, not of the authority as a parser would delimit it: a password typed
    // without percent-encoding may hold `/`, `?` or `#`, and none of it may show. (No `@` belongs after the
    // authority of a Redis URL.)
    let Some(at) = raw[authority_start..].rfind('@') else {
        return raw.to_owned();
    };
    let userinfo = &raw[authority_start..authority_start + at];
    let masked = if userinfo.contains(':') && !userinfo.starts_with(':') {
        "***:***"
    } else {
        // `:password`, or a lone userinfo component, which redis URLs treat as a password.
        "***"
    };
    format!(
        "{}{}{}",
        &raw[..authority_start],
        masked,
        &raw[authority_start + at..]
    )
}

/// TLS material shared by every `rediss://` endpoint of one quorum.
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// PEM bundle of the CA that signed the masters' certificates; `None` uses the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key, for masters that require mutual TLS.
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .finish()
    }
}

/// How often and how patiently a failed acquisition is retried.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included.
    pub attempts: u32,
    /// Bounds of the random pause between attempts; the randomness keeps contending clients from retrying in
    /// lockstep and splitting the votes again.
    pub delay_min: Duration,
    pub delay_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            delay_min: Duration::from_millis(50),
            delay_max: Duration::from_millis(250),
        }
    }
}

/// Upper bounds of the settings, far above any sensible value: they keep every instant and timestamp computed
/// from a setting (quarantine ends, deadlines, status times) inside the clocks' range, so that no configuration
/// can make the arithmetic on them overflow.
pub const LIMIT_NODE_TIMEOUT: Duration = Duration::from_secs(60);
pub const LIMIT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
pub const LIMIT_RETRY_DELAY: Duration = Duration::from_secs(60);
pub const LIMIT_RETRY_ATTEMPTS: u32 = 100;

#[derive(Clone, Debug)]
pub struct RedlockConfig {
    pub endpoints: Vec<Endpoint>,
    /// How long one master may take to answer one command before it counts as timed out.
    pub node_timeout: Duration,
    /// How long connecting (TCP, TLS, AUTH and the restart check) to one master may take.
    pub connect_timeout: Duration,
    /// Clock drift allowance: `ttl * drift_factor + drift_floor` is subtracted from every validity.
    pub drift_factor: f64,
    pub drift_floor: Duration,
    pub retry: RetryPolicy,
    /// The longest TTL any client of these masters uses. A master that restarted less than this (plus drift)
    /// ago may have forgotten a live lock, so it gets no writes and no vote until then.
    pub max_ttl: Duration,
    /// Skip the restart quarantine: only for masters that fsync every write (`appendfsync always`).
    pub assume_durable: bool,
    /// How long a key's fencing counter outlives the last grant (or repair) of its lock. Longer than a year by
    /// default, so that even yearly jobs keep their sequence; short enough that counters of resource names used
    /// once do not pile up on the masters forever.
    pub token_retention: Duration,
    pub tls: TlsOptions,
    /// The negative control of the engine checker's fair mode: acquisitions skip the key's fair queue (sent
    /// without it, they are decided as before the queue existed). Only in builds with the `negative-controls`
    /// feature, which only the tests and benchmarks enable.
    #[cfg(feature = "negative-controls")]
    #[doc(hidden)]
    pub skip_queue: bool,
    /// Waiters do not listen for releases and ask every [`QUEUE_POLL`](super::QUEUE_POLL), as before they
    /// listened: the fairness benchmark's figure beside the listening one. Tests and benchmarks only.
    #[cfg(feature = "negative-controls")]
    #[doc(hidden)]
    pub poll_only: bool,
    /// The pace of a listening waiter that hears nothing, instead of [`QUEUE_FALLBACK`](super::QUEUE_FALLBACK):
    /// a test makes it longer than its patience, so that only an announcement can wake the waiter in time.
    #[cfg(feature = "negative-controls")]
    #[doc(hidden)]
    pub queue_fallback: Option<Duration>,
    /// The negative control of the engine checker's slow-rememberers scenario: an acquisition is decided as soon
    /// as a majority grants, even when a master restarted recently is among them (see
    /// [`RECENT_RESTART`](super::quarantine::RECENT_RESTART)). Tests and benchmarks only.
    #[cfg(feature = "negative-controls")]
    #[doc(hidden)]
    pub decide_before_counters: bool,
}

/// 400 days.
pub const DEFAULT_TOKEN_RETENTION: Duration = Duration::from_secs(400 * 24 * 3600);

impl RedlockConfig {
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        Self {
            endpoints,
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            drift_floor: Duration::from_millis(2),
            retry: RetryPolicy::default(),
            max_ttl: Duration::from_secs(60),
            assume_durable: false,
            token_retention: DEFAULT_TOKEN_RETENTION,
            tls: TlsOptions::default(),
            #[cfg(feature = "negative-controls")]
            skip_queue: false,
            #[cfg(feature = "negative-controls")]
            poll_only: false,
            #[cfg(feature = "negative-controls")]
            queue_fallback: None,
            #[cfg(feature = "negative-controls")]
            decide_before_counters: false,
        }
    }

    /// Whether fair waiters listen for releases, and how often they ask when they hear nothing: (true,
    /// [`QUEUE_FALLBACK`](super::QUEUE_FALLBACK)), or (false, [`QUEUE_POLL`](super::QUEUE_POLL)) for the
    /// poll-only control of tests and benchmarks.
    pub(super) fn waiting_pace(&self) -> (bool, Duration) {
        #[cfg(feature = "negative-controls")]
        {
            if self.poll_only {
                return (false, super::QUEUE_POLL);
            }
            (true, self.queue_fallback.unwrap_or(super::QUEUE_FALLBACK))
        }
        #[cfg(not(feature = "negative-controls"))]
        (true, super::QUEUE_FALLBACK)
    }

    /// Whether an acquisition granted by a recently restarted master waits for the other masters' counters
    /// (always, but in the negative control of tests and benchmarks).
    pub(super) fn waits_for_counters(&self) -> bool {
        #[cfg(feature = "negative-controls")]
        return !self.decide_before_counters;
        #[cfg(not(feature = "negative-controls"))]
        true
    }

    /// Whether acquisitions skip the fair queue (a negative control; never in a release build).
    pub(super) fn skips_queue(&self) -> bool {
        #[cfg(feature = "negative-controls")]
        return self.skip_queue;
        #[cfg(not(feature = "negative-controls"))]
        false
    }

    pub fn from_urls<S: AsRef<str>>(urls: &[S]) -> Result<Self, ConfigError> {
        let endpoints = urls
            .iter()
            .map(|url| Endpoint::parse(url.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let config = Self::new(endpoints);
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.endpoints.is_empty() {
            return Err(ConfigError::NoEndpoints);
        }
        let within = |what: &str, value: Duration, limit: Duration| {
            if value.is_zero() || value > limit {
                Err(ConfigError::Invalid(format!(
                    "{what} must be greater than 0 and at most {}",
                    crate::duration::format(limit)
                )))
            } else {
                Ok(())
            }
        };
        within("node timeout", self.node_timeout, LIMIT_NODE_TIMEOUT)?;
        within("connect timeout", self.connect_timeout, LIMIT_NODE_TIMEOUT)?;
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(ConfigError::Invalid(format!(
                "drift factor {} is outside [0, 0.5)",
                self.drift_factor
            )));
        }
        within("max TTL", self.max_ttl, LIMIT_MAX_TTL)?;
        if !(1..=LIMIT_RETRY_ATTEMPTS).contains(&self.retry.attempts) {
            return Err(ConfigError::Invalid(format!(
                "retry attempts must be between 1 and {LIMIT_RETRY_ATTEMPTS}"
            )));
        }
        if self.token_retention <= self.max_ttl {
            return Err(ConfigError::Invalid(format!(
                "token retention {} must exceed max-ttl {}: a counter must outlive every lock of its key",
                crate::duration::format(self.token_retention),
                crate::duration::format(self.max_ttl)
            )));
        }
        if self.retry.delay_max > LIMIT_RETRY_DELAY {
            return Err(ConfigError::Invalid(format!(
                "retry delay must be at most {}",
                crate::duration::format(LIMIT_RETRY_DELAY)
            )));
        }
        if self.retry.delay_min > self.retry.delay_max {
            return Err(ConfigError::Invalid(format!(
                "retry delay range {:?}..{:?} is empty",
                self.retry.delay_min, self.retry.delay_max
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for endpoint in &self.endpoints {
            if !seen.insert(endpoint.url()) {
                return Err(ConfigError::Invalid(format!(
                    "endpoint {endpoint} is listed twice; each master must count once"
                )));
            }
        }
        Ok(())
    }

    /// A majority of the configured masters; down or quarantined masters still count in N.
    pub fn quorum(&self) -> usize {
        super::quorum::quorum_of(self.endpoints.len())
    }

    /// The clock-drift allowance for a lock of this TTL.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + self.drift_floor
    }

    /// How long a restarted master stays out of the quorum.
    pub fn quarantine_period(&self) -> Duration {
        self.max_ttl + self.drift(self.max_ttl)
    }

    pub fn check_ttl(&self, ttl: Duration) -> Result<(), ConfigError> {
        if ttl < Duration::from_millis(1) {
            return Err(ConfigError::InvalidTtl("ttl must be at least 1ms".into()));
        }
        // The masters keep the key for whole milliseconds; a validity computed from a finer TTL could outlast it.
        if !crate::duration::is_whole_millis(ttl) {
            return Err(ConfigError::InvalidTtl(format!(
                "ttl {} is not a whole number of milliseconds, which Redis keeps a key's time to live in",
                crate::duration::format(ttl)
            )));
        }
        if ttl > self.max_ttl {
            return Err(ConfigError::InvalidTtl(format!(
                "ttl {} exceeds max-ttl {}; restarted masters are only kept out for max-ttl, so a longer lock could be granted twice",
                crate::duration::format(ttl),
                crate::duration::format(self.max_ttl)
            )));
        }
        if self.drift(ttl) >= ttl {
            return Err(ConfigError::InvalidTtl(format!(
                "ttl {} leaves no validity after the clock-drift allowance",
                crate::duration::format(ttl)
            )));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("no Redis masters configured")]
    NoEndpoints,
    #[error("invalid Redis endpoint {endpoint}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("invalid ttl: {0}")]
    InvalidTtl(String),
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_the_display_form() {
        let endpoint = Endpoint::parse("redis://alice:s3cret@127.0.0.1:6379/0").unwrap();
        assert_eq!(endpoint.display(), "redis://***:***@127.0.0.1:6379/0");
        assert!(!format!("{endpoint:?}{endpoint}").contains("alice"));
        let endpoint = Endpoint::parse("rediss://:s3cret@127.0.0.1:6380").unwrap();
        assert_eq!(endpoint.display(), "rediss://***@127.0.0.1:6380");
        assert!(endpoint.is_tls());
        assert!(!format!("{endpoint:?}").contains("s3cret"));
    }

    #[test]
    fn passwords_typed_without_encoding_never_show_either() {
        for raw in [
            "redis://:p@ss/w?rd#1@127.0.0.1:6379",
            "redis://u:p/ss@127.0.0.1:6379",
        ] {
            let shown = match Endpoint::parse(raw) {
                Ok(endpoint) => endpoint.display().to_owned(),
                Err(err) => err.to_string(),
            };
            assert!(!shown.contains("ss") && !shown.contains("rd"), "{raw}: {shown}");
        }
    }

    #[test]
    fn credentials_are_put_in_percent_encoded() {
        let url = with_credentials("rediss://a:6380", Some("locker"), Some("p@ss:w/rd %1")).unwrap();
        assert_eq!(url, "rediss://locker:p%40ss%3Aw%2Frd%20%251@a:6380");
        assert_eq!(
            Endpoint::parse(&url).unwrap().display(),
            "rediss://***:***@a:6380"
        );
        assert_eq!(
            with_credentials("redis://a:1", None, None).unwrap(),
            "redis://a:1"
        );
    }

    #[test]
    fn bad_endpoints_are_rejected_with_a_reason() {
        for raw in ["", "127.0.0.1:6379", "http://x:1", "redis://", "redis://:pw@"] {
            let err = Endpoint::parse(raw).unwrap_err();
            assert!(matches!(err, ConfigError::InvalidEndpoint { .. }), "{raw}: {err}");
        }
        let err = Endpoint::parse("redis://user:topsecret@").unwrap_err();
        assert!(!err.to_string().contains("topsecret"), "{err}");
        let err = Endpoint::parse("rediss://127.0.0.1:6380#insecure").unwrap_err();
        assert!(err.to_string().contains("certificate check"), "{err}");
        let err = Endpoint::parse("redis://127.0.0.1:6380#x").unwrap_err();
        assert!(err.to_string().contains("no fragment"), "{err}");
    }

    #[test]
    fn quorum_counts_every_configured_master() {
        let urls: Vec<String> = (0..5)
            .map(|i| format!("redis://127.0.0.1:{}", 7000 + i))
            .collect();
        let config = RedlockConfig::from_urls(&urls).unwrap();
        assert_eq!(config.quorum(), 3);
        assert_eq!(config.drift(Duration::from_secs(10)), Duration::from_millis(102));
    }

    #[test]
    fn ttl_bounds_are_checked() {
        let config = RedlockConfig::from_urls(&["redis://127.0.0.1:1"]).unwrap();
        assert!(config.check_ttl(Duration::ZERO).is_err());
        assert!(config.check_ttl(Duration::from_secs(61)).is_err());
        assert!(config.check_ttl(Duration::from_millis(2)).is_err());
        assert!(config.check_ttl(Duration::from_secs(10)).is_ok());
        assert!(config.check_ttl(Duration::from_millis(1500)).is_ok());
        let finer = config.check_ttl(Duration::from_micros(10_000_500)).unwrap_err();
        assert!(
            finer.to_string().contains("whole number of milliseconds"),
            "{finer}"
        );
    }

    #[test]
    fn settings_beyond_their_limits_are_rejected() {
        let valid = RedlockConfig::from_urls(&["redis://127.0.0.1:1"]).unwrap();
        let huge = Duration::from_secs(100_000_000 * 3600);
        let mut config = valid.clone();
        config.max_ttl = huge;
        assert!(config.validate().unwrap_err().to_string().contains("max TTL"));
        let mut config = valid.clone();
        config.node_timeout = huge;
        assert!(config.validate().is_err());
        let mut config = valid.clone();
        config.retry.delay_min = huge;
        config.retry.delay_max = huge;
        assert!(config.validate().is_err());
        let mut config = valid;
        config.retry.attempts = u32::MAX;
        assert!(config.validate().is_err());
    }

    #[test]
    fn duplicate_endpoints_are_rejected() {
        let err = RedlockConfig::from_urls(&["redis://127.0.0.1:1", "redis://127.0.0.1:1"]).unwrap_err();
        assert!(err.to_string().contains("listed twice"));
    }
}
