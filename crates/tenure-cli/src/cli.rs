//! Command-line syntax. Flag names are a contract: scripts and unit files
//! depend on them. Every flag can also come from a `TENURE_*` variable.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Leader election on Redis: run a command on exactly one host at a time.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, propagate_version = true, after_help = after_help())]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log filter (tracing syntax, e.g. `info`, `debug`); logs go to stderr.
    /// Default: `info`, or `warn` for `demo`.
    #[arg(long, global = true, env = "TENURE_LOG", value_parser = parse_log_filter)]
    pub log: Option<String>,

    /// Log lines as text, or as one JSON object per line for log shippers.
    #[arg(long, global = true, env = "TENURE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

const EXAMPLES: &str = "\
Examples:
  tenure run --election nightly-report --once -- ./report.sh
  tenure run --election mailer --redis rediss://app@redis:6380 \\
      --password-file /run/secrets/redis -- ./mailer
  tenure serve --election scheduler --election cleanup
  curl -s http://127.0.0.1:7878/v1/elections/scheduler
  tenure status --json
  tenure watch mailer";

fn after_help() -> String {
    format!("{EXAMPLES}\n\nExit status:\n{}", crate::exit::TABLE)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run CMD while this instance is leader of the election; campaign again
    /// after losing leadership.
    Run(RunArgs),
    /// Show who leads each election.
    Status(StatusArgs),
    /// Print every change of leader of an election, live, until interrupted.
    Watch(WatchArgs),
    /// Campaign for each --election and tell local programs over HTTP
    /// whether they may act as leader, with the fencing token and the time
    /// left (a sidecar for services in any language).
    Serve(ServeArgs),
    /// Show tenure at work: elections, a crash, a handover, fencing tokens.
    Demo(DemoArgs),
    /// Print a shell completion script (e.g. `tenure completions bash > /etc/bash_completion.d/tenure`).
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `tenure man | man -l -`.
    Man,
    /// Print the SQL that creates a store's tables, for an owner to run
    /// before a least-privilege role uses the store (e.g. `tenure schema
    /// postgres | psql "$OWNER_URL" -v ON_ERROR_STOP=1`), with the grant
    /// the role needs as a comment at its end.
    Schema {
        /// The store whose schema to print.
        store: SchemaStore,
    },
    /// Internal: the guardian `tenure run` puts around CMD.
    #[command(name = "__guardian", hide = true)]
    Guardian(GuardianArgs),
}

/// The stores with a schema of tables (`tenure schema`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SchemaStore {
    /// PostgreSQL (`postgres://`).
    Postgres,
}

/// Where Redis is and how keys are named.
#[derive(Debug, Args, Clone)]
pub struct RedisArgs {
    /// The store's URL: redis://[user[:password]@]host[:port][/db] (rediss://
    /// for TLS, redis+unix:///path/to/redis.sock[?db=N]) for one server;
    /// redis+sentinel://[user[:password]@]host:port[,host:port...]/SERVICE[/db]
    /// for Redis Sentinel; redis+cluster://[user[:password]@]host:port[,host:port...]
    /// for Redis Cluster (rediss+sentinel://, rediss+cluster:// for TLS);
    /// etcd://[user[:password]@]host:port[,host:port...] for etcd (etcds://
    /// for TLS); zk://[user:password@]host:port[,host:port...][/chroot] for
    /// a ZooKeeper ensemble (digest auth);
    /// postgres://[user[:password]@]host[:port]/database[?sslmode=require] for
    /// PostgreSQL; sqlite:///path/to/file.db for processes on one host. [default: redis://127.0.0.1:6379; env TENURE_REDIS_URL is
    /// read too]
    #[arg(
        long = "store",
        visible_alias = "redis",
        env = "TENURE_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub store: Option<String>,

    /// The store URL in use: `--store`, else `TENURE_REDIS_URL`, else the
    /// default (set by [`RedisArgs::resolve`]).
    #[arg(skip)]
    pub url: String,

    /// Read the store's password from this file (one trailing newline is
    /// ignored) instead of putting it in the URL.
    #[arg(long, env = "TENURE_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,

    /// CA certificate (PEM) to verify a rediss:// server or an etcds://
    /// cluster with, instead of the system's roots.
    #[arg(long, env = "TENURE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for an etcds:// cluster that requires one.
    #[arg(long, env = "TENURE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The key (PEM) of --tls-cert.
    #[arg(long, env = "TENURE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Key prefix shared by all instances.
    #[arg(long, env = "TENURE_PREFIX", default_value = tenure::DEFAULT_PREFIX)]
    pub prefix: String,

    /// Accept a Redis whose maxmemory-policy may evict keys. An evicted lease
    /// lets a second leader in while the first still leads: allow it only if
    /// fencing tokens protect every write.
    #[arg(long, env = "TENURE_ALLOW_EVICTION", value_parser = BoolishValueParser::new())]
    pub allow_eviction: bool,
}

/// The store URL when neither `--store` nor `TENURE_STORE` gives one.
pub const DEFAULT_STORE: &str = "redis://127.0.0.1:6379";

/// The store URL of `--store`/`TENURE_STORE`, else of the older
/// `TENURE_REDIS_URL`, else `default`.
pub fn store_url(given: Option<&str>, default: Option<&str>) -> Option<String> {
    given
        .map(str::to_string)
        .or_else(|| {
            std::env::var("TENURE_REDIS_URL")
                .ok()
                .filter(|url| !url.is_empty())
        })
        .or(default.map(str::to_string))
}

impl RedisArgs {
    /// Fill in [`RedisArgs::url`].
    pub fn resolve(&mut self) {
        self.url = store_url(self.store.as_deref(), Some(DEFAULT_STORE)).unwrap_or_default();
    }

    /// Refuse flags the URL would silently ignore: `--tls-ca` on a plain
    /// URL (redis://, etcd://, a Unix socket) verifies nothing.
    pub fn check(&self) -> Result<(), String> {
        let tls = self.url.starts_with("rediss")
            || self.url.starts_with("etcds://")
            || (self.url.starts_with("postgres") && self.url.contains("sslmode=require"));
        if self.tls_ca.is_some() && !tls {
            return Err(format!(
                "--tls-ca is for rediss://, etcds:// and postgres://…?sslmode=require URLs, and \
                 {} is not TLS: use a TLS URL, or drop --tls-ca",
                tenure::redact_url(&self.url)
            ));
        }
        Ok(())
    }

    /// The client certificate and key, when both are given.
    pub fn tls_client(&self) -> Option<(&PathBuf, &PathBuf)> {
        self.tls_cert.as_ref().zip(self.tls_key.as_ref())
    }

    /// The store's settings: its URL and TLS files.
    pub fn store(&self) -> tenure::StoreBuilder {
        let mut builder = tenure::Store::open(&self.url);
        if let Some(ca) = &self.tls_ca {
            builder = builder.tls_ca_file(ca);
        }
        if let Some((cert, key)) = self.tls_client() {
            builder = builder.tls_client_cert_file(cert, key);
        }
        builder
    }

    /// Connect to the store (for `status`).
    pub async fn connect(&self) -> tenure::Result<tenure::Store> {
        self.store().connect().await
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Name of the election: instances with the same name compete.
    #[arg(long, env = "TENURE_ELECTION")]
    pub election: String,

    #[command(flatten)]
    pub redis: RedisArgs,

    #[command(flatten)]
    pub term: TermArgs,

    /// Time CMD gets between SIGTERM and SIGKILL; always capped so CMD is
    /// gone before the lease could pass to another instance.
    #[arg(long, env = "TENURE_KILL_GRACE", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub kill_grace: Duration,

    /// Serve /metrics, /healthz and /readyz on this address (a bare port binds 127.0.0.1).
    #[arg(long, env = "TENURE_METRICS_ADDR", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<SocketAddr>,

    /// Run CMD once if this instance becomes leader, then resign and exit with its status.
    #[arg(long, env = "TENURE_ONCE", value_parser = BoolishValueParser::new())]
    pub once: bool,

    /// Exit at once (status 75) if another instance leads, instead of waiting.
    #[arg(long, env = "TENURE_NO_WAIT", value_parser = BoolishValueParser::new())]
    pub no_wait: bool,

    /// With --once: give up (status 75) if not elected within this long.
    #[arg(long, env = "TENURE_WAIT_TIMEOUT", value_parser = parse_duration, allow_hyphen_values = true, requires = "once", conflicts_with = "no_wait")]
    pub wait_timeout: Option<Duration>,

    /// With --once: skip (exit 0) if CMD already succeeded within this period
    /// anywhere in the cluster.
    #[arg(long, env = "TENURE_AT_MOST_EVERY", value_parser = parse_period, allow_hyphen_values = true, requires = "once")]
    pub at_most_every: Option<Duration>,

    /// Let up to N instances run CMD at once: a semaphore of N permits
    /// named after the election. CMD's TENURE_ELECTION names its permit
    /// (ELECTION/permit-I), whose tokens TENURE_TOKEN counts. Every
    /// instance must give the same N.
    #[arg(long, env = "TENURE_SLOTS", value_parser = clap::value_parser!(u32).range(1..=1000), conflicts_with = "at_most_every")]
    pub slots: Option<u32>,

    /// Run CMD on the leader once per slot of this cron expression (five
    /// fields, or six with seconds first; @daily and the like): each slot
    /// at most once across failovers, CMD's TENURE_SLOT naming it. This
    /// instance keeps running; CMD's exit status is logged per run.
    #[arg(long, env = "TENURE_CRON", value_parser = parse_cron, conflicts_with_all = ["once", "no_wait", "slots", "at_most_every"])]
    pub cron: Option<String>,

    /// With --cron: the IANA time zone the expression is read in.
    #[arg(long, env = "TENURE_TZ", default_value = "UTC", requires = "cron")]
    pub tz: String,

    /// With --cron: how late a missed slot may still run (the latest one
    /// that passed with no leader); later, it is skipped and logged.
    #[arg(long, env = "TENURE_STARTING_DEADLINE", default_value = "60s", value_parser = parse_duration, allow_hyphen_values = true, requires = "cron")]
    pub starting_deadline: Duration,

    /// Put CMD in a cgroup v2 of its own, so `cgroup.kill` stops its whole
    /// tree at once: `auto` where the cgroup is writable (root, or systemd's
    /// Delegate=yes), `require` to refuse to run without one, `off`.
    #[arg(long, env = "TENURE_CGROUP", value_enum, default_value_t = CgroupMode::Auto)]
    pub cgroup: CgroupMode,

    /// The command and its arguments, passed on as they are (they need
    /// not be UTF-8).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// How an instance holds its terms: the same flags for `run` and `serve`.
#[derive(Debug, Args, Clone)]
pub struct TermArgs {
    /// Lease time-to-live.
    #[arg(long, env = "TENURE_TTL", default_value = "15s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ttl: Duration,

    /// How often the leader renews (default: ttl/3).
    #[arg(long, env = "TENURE_RENEW_EVERY", value_parser = parse_duration, allow_hyphen_values = true)]
    pub renew_every: Option<Duration>,

    /// The largest ttl any instance of the election uses (default: --ttl).
    /// After Redis lost or rolled back data, no lease is granted until this
    /// long after it came back; set it to the old ttl during a rolling
    /// change to a shorter one.
    #[arg(long, env = "TENURE_MAX_TTL", value_parser = parse_duration, allow_hyphen_values = true)]
    pub max_ttl: Option<Duration>,

    /// Safety margin subtracted from the ttl for the local deadline (default: ttl/10, at most 2s).
    #[arg(long, env = "TENURE_MARGIN", value_parser = parse_duration, allow_hyphen_values = true)]
    pub margin: Option<Duration>,

    /// This instance's id (default: hostname plus 128 random bits).
    #[arg(long, env = "TENURE_ID")]
    pub id: Option<String>,
}

impl TermArgs {
    /// `builder` with these settings.
    pub fn apply(&self, builder: tenure::ElectionBuilder) -> tenure::ElectionBuilder {
        let mut builder = builder.ttl(self.ttl);
        if let Some(max_ttl) = self.max_ttl {
            builder = builder.max_ttl(max_ttl);
        }
        if let Some(every) = self.renew_every {
            builder = builder.renew_every(every);
        }
        if let Some(margin) = self.margin {
            builder = builder.margin(margin);
        }
        if let Some(id) = &self.id {
            builder = builder.id(id);
        }
        builder
    }
}

/// Whether `tenure run` puts CMD in a cgroup of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupMode {
    /// Where a writable cgroup v2 is available.
    Auto,
    /// Always; exit 70 if there is no usable cgroup.
    Require,
    /// Never: only process groups and subreapers contain CMD.
    Off,
}

/// The default address of `tenure serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// An election to campaign for; repeat the flag, or separate names with
    /// commas, for several.
    #[arg(
        long = "election",
        env = "TENURE_ELECTION",
        value_delimiter = ',',
        required = true
    )]
    pub elections: Vec<String>,

    #[command(flatten)]
    pub redis: RedisArgs,

    /// Serve the API on this address (a bare port binds 127.0.0.1). Any other
    /// than a loopback address needs --auth-token-file or TENURE_AUTH_TOKEN.
    #[arg(long, env = "TENURE_LISTEN", default_value = DEFAULT_LISTEN, value_parser = parse_listen_addr)]
    pub listen: SocketAddr,

    /// Require `Authorization: Bearer TOKEN` on POST requests, with TOKEN
    /// read from this file (one trailing newline is ignored). The token can
    /// come from the variable TENURE_AUTH_TOKEN instead (never a flag: flags
    /// show in `ps`).
    #[arg(long, env = "TENURE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// The longest `deadline_ms` one answer hands out. A resign or shutdown
    /// releases the lease only once every deadline handed out has passed,
    /// so this bounds a graceful hand-over while clients are acting; clients
    /// ask again (or read the event stream, which repeats the state every
    /// third of it) more often than this.
    /// At least 10ms.
    #[arg(long, env = "TENURE_MAX_DEADLINE", default_value = "2s", value_parser = parse_max_deadline, allow_hyphen_values = true)]
    pub max_deadline: Duration,

    /// Make every --election a semaphore of N permits (as `tenure run
    /// --slots N`): up to N instances hold one at once, and each answer
    /// names the permit this instance holds. Every instance must give the
    /// same N.
    #[arg(long, env = "TENURE_SLOTS", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub slots: Option<u32>,

    #[command(flatten)]
    pub term: TermArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Elections to show (default: every election with a live lease under the prefix).
    pub names: Vec<String>,

    #[command(flatten)]
    pub redis: RedisArgs,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Show each NAME as a semaphore of N permits (as `tenure run --slots
    /// N` keeps it): every permit, held or free, and how many are held.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000), requires = "names")]
    pub slots: Option<u32>,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The election to watch.
    pub name: String,

    #[command(flatten)]
    pub redis: RedisArgs,

    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,

    /// Watch NAME as a semaphore of N permits (as `tenure run --slots N`
    /// keeps it): every change of holder of each permit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub slots: Option<u32>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Use this store (any URL `tenure run --store` takes) instead of
    /// starting a private redis-server. [env TENURE_REDIS_URL is read too]
    #[arg(
        long = "store",
        visible_alias = "redis",
        env = "TENURE_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub url: Option<String>,

    /// Read the password of --store from this file.
    #[arg(long, env = "TENURE_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,

    /// Lease ttl the demo's candidates use (100ms to 60s).
    #[arg(long, default_value = "2s", value_parser = parse_demo_ttl, allow_hyphen_values = true)]
    pub ttl: Duration,
}

#[derive(Debug, Args)]
pub struct GuardianArgs {
    /// Abstract Unix socket name the `tenure run` that started this guardian listens on.
    #[arg(long)]
    pub channel: String,

    /// The cgroup CMD starts in (made by `tenure run`).
    #[arg(long)]
    pub cgroup: Option<std::path::PathBuf>,

    /// Refuse to start CMD if it cannot be put in `--cgroup`.
    #[arg(long, requires = "cgroup")]
    pub cgroup_required: bool,

    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// A tracing filter, checked: a typo must not silently mean `info`.
pub fn parse_log_filter(text: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(text)
        .map(|_| text.to_string())
        .map_err(|err| format!("not a log filter ({err}); e.g. info, debug, tenure=debug,warn"))
}

/// When `err` is about a value that came from a `TENURE_*` variable rather
/// than the command line `args`, a message that names the variable.
pub fn invalid_variable(
    command: &clap::Command,
    err: &clap::Error,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(flag)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let Some(ContextValue::String(value)) = err.get(ContextKind::InvalidValue) else {
        return None;
    };
    // "--ttl <TTL>" -> "ttl"
    let long = flag.split_whitespace().next()?.strip_prefix("--")?;
    let variable = find_long(command, long)?.get_env()?.to_owned();
    if std::env::var_os(&variable).as_deref() != Some(std::ffi::OsStr::new(value)) {
        return None;
    }
    let on_command_line = args.into_iter().any(|arg| {
        arg.to_str().is_some_and(|arg| {
            arg.strip_prefix("--")
                .is_some_and(|rest| rest == long || rest.starts_with(&format!("{long}=")))
        })
    });
    if on_command_line {
        return None;
    }
    let why = match (
        std::error::Error::source(err),
        err.get(ContextKind::ValidValue),
    ) {
        (Some(source), _) => source.to_string(),
        (None, Some(ContextValue::Strings(valid))) => {
            format!("expected one of {}", valid.join(", "))
        }
        (None, _) => "invalid value".to_string(),
    };
    Some(format!(
        "invalid value {value:?} in {}: {why}",
        variable.to_string_lossy()
    ))
}

/// The argument with this long name, in `command` or any subcommand.
fn find_long<'a>(command: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(long))
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_long(sub, long))
        })
}

/// Parse `500ms`, `15s`, `2m`, `1h30m`, `24h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if text.trim().starts_with('-') {
        return Err("must not be negative".into());
    }
    let duration = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (use a unit, e.g. 500ms, 15s, 2m, 24h)"))?;
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(duration)
}

/// `run --cron`: an expression the library's schedule reads.
pub fn parse_cron(text: &str) -> Result<String, String> {
    match tenure::Schedule::cron(text) {
        Ok(_) => Ok(text.to_string()),
        Err(tenure::Error::Config(why)) => Err(why),
        Err(err) => Err(err.to_string()),
    }
}

/// `run --at-most-every`: the store keeps the last-run record at most a
/// hundred years, so a longer period could not be honoured.
pub fn parse_period(text: &str) -> Result<Duration, String> {
    let period = parse_duration(text)?;
    if period > PERIOD_MAX {
        return Err(
            "must be at most 100 years: the store keeps the last-run record no longer".into(),
        );
    }
    Ok(period)
}

const PERIOD_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The demo's ttl: long enough that its measurements mean something, short
/// enough that it does not seem to hang.
pub fn parse_demo_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if !(DEMO_TTL_MIN..=DEMO_TTL_MAX).contains(&ttl) {
        return Err(format!(
            "the demo's ttl must be between {} and {}",
            humantime::format_duration(DEMO_TTL_MIN),
            humantime::format_duration(DEMO_TTL_MAX)
        ));
    }
    Ok(ttl)
}

/// `serve --max-deadline`: an answer hands out time in whole milliseconds,
/// so below one it hands out none and no client could ever act; a few
/// milliseconds would be gone in the request's own round trip.
pub fn parse_max_deadline(text: &str) -> Result<Duration, String> {
    let max = parse_duration(text)?;
    if max < MAX_DEADLINE_MIN {
        return Err(format!(
            "must be at least {}: each answer hands out at most this much time to act, \
             in whole milliseconds, and a client needs some of it left after the request",
            humantime::format_duration(MAX_DEADLINE_MIN)
        ));
    }
    Ok(max)
}

const MAX_DEADLINE_MIN: Duration = Duration::from_millis(10);

const DEMO_TTL_MIN: Duration = Duration::from_millis(100);
const DEMO_TTL_MAX: Duration = Duration::from_secs(60);

/// Parse `9090` (127.0.0.1:9090), `127.0.0.1:9090`, `0.0.0.0:9090`, `[::1]:9090`.
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse::<SocketAddr>()
        .map_err(|_| format!("{text:?} is not a port or an address like 127.0.0.1:9090"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units_and_must_be_positive() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("15").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("-1s"), Err("must not be negative".into()));
    }

    #[test]
    fn the_demo_ttl_is_bounded() {
        assert_eq!(parse_demo_ttl("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_demo_ttl("60s"), Ok(Duration::from_secs(60)));
        assert!(parse_demo_ttl("99ms").is_err());
        assert!(parse_demo_ttl("61s").is_err());
    }

    #[test]
    fn the_period_fits_the_last_run_record() {
        assert_eq!(parse_period("36500d").map(|_| ()), Ok(()));
        assert!(parse_period("101y").is_err());
    }

    #[test]
    fn the_max_deadline_can_hand_out_time() {
        assert_eq!(parse_max_deadline("10ms"), Ok(Duration::from_millis(10)));
        assert!(parse_max_deadline("9ms").is_err());
        assert!(parse_max_deadline("500us").is_err());
    }

    #[test]
    fn a_bare_port_binds_loopback_only() {
        assert_eq!(
            parse_listen_addr("9090"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9090)))
        );
        assert_eq!(
            parse_listen_addr("0.0.0.0:80"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 80)))
        );
        assert!(parse_listen_addr("localhost").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
