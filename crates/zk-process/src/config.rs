//! What a member is started with: its `zoo.cfg`, the logging configuration
//! and the JVM's command line.
//!
//! Every setting is written out, none left to ZooKeeper's defaults, so that
//! a member's directory says exactly how it ran.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::member::Member;
use crate::{io_err, Error, Installation};

/// The class `zkServer.sh` starts: it reads `zoo.cfg` and runs a quorum
/// peer, or a standalone server when the file names no other servers.
const SERVER_MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

/// The logging configuration of the members (in the ensemble's directory).
pub(crate) const SERVER_LOG4J: &str = "log4j-server.properties";

/// The logging configuration of the command-line client: silent, so that
/// its output is the command's.
pub(crate) const CLI_LOG4J: &str = "log4j-cli.properties";

/// Log4j 1.2 (Debian's ZooKeeper logs through it): INFO and above to
/// stdout, which the member's log file is. The connection class logs every
/// four-letter word at INFO, and the ensemble asks many: only its warnings.
const SERVER_LOG4J_TEXT: &str = "\
log4j.rootLogger=INFO, STDOUT
log4j.appender.STDOUT=org.apache.log4j.ConsoleAppender
log4j.appender.STDOUT.layout=org.apache.log4j.PatternLayout
log4j.appender.STDOUT.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
log4j.logger.org.apache.zookeeper.server.NIOServerCnxn=WARN
";

const CLI_LOG4J_TEXT: &str = "log4j.rootLogger=OFF\n";

/// The settings every member of an ensemble shares.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) tick_time: Duration,
    pub(crate) min_session_timeout: Duration,
    pub(crate) max_session_timeout: Duration,
    /// Extra `zoo.cfg` lines ([`crate::ZkBuilder::config`]), written last.
    pub(crate) extra: Vec<(String, String)>,
}

/// Write the logging configurations into the ensemble's directory `root`.
pub(crate) fn write_log4j(root: &Path) -> Result<(), Error> {
    for (name, text) in [
        (SERVER_LOG4J, SERVER_LOG4J_TEXT),
        (CLI_LOG4J, CLI_LOG4J_TEXT),
    ] {
        let path = root.join(name);
        std::fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
    }
    Ok(())
}

/// The `zoo.cfg` of `member`, one of `all`.
pub(crate) fn zoo_cfg(member: &Member, all: &[Member], settings: &Settings) -> String {
    let mut cfg = format!(
        "# Written by zk-process for member m{} (server id {}).\n",
        member.index,
        member.server_id()
    );
    let mut line = |key: &str, value: &dyn std::fmt::Display| {
        // Writing to a String cannot fail.
        let _ = writeln!(cfg, "{key}={value}");
    };
    line("tickTime", &settings.tick_time.as_millis());
    // Followers get 10 ticks to connect to a new leader and sync with it,
    // and are dropped (a leader steps down) after 5 ticks without a word.
    line("initLimit", &10);
    line("syncLimit", &5);
    line("dataDir", &member.data_dir().display());
    line("clientPort", &member.client_port);
    line("clientPortAddress", &"127.0.0.1");
    line(
        "minSessionTimeout",
        &settings.min_session_timeout.as_millis(),
    );
    line(
        "maxSessionTimeout",
        &settings.max_session_timeout.as_millis(),
    );
    line("4lw.commands.whitelist", &"*");
    // Transaction logs grow 1 MiB at a time rather than ZooKeeper's 64.
    line("preAllocSize", &1024);
    // No fsync: a member killed with SIGKILL loses nothing written to the
    // kernel, and fsync is what makes a loaded machine's tests slow. (A
    // power cut would lose data; tests do not cut power.)
    line("forceSync", &"no");
    // A member whose peer is paused must not wait ZooKeeper's 5 s for a
    // connection to it before it can vote.
    line("cnxTimeout", &1000);
    if all.len() > 1 {
        line("standaloneEnabled", &"false");
        for peer in all {
            let address = format!("127.0.0.1:{}:{}", peer.quorum_port, peer.election_port);
            line(&format!("server.{}", peer.server_id()), &address);
        }
    }
    for (key, value) in &settings.extra {
        line(key, value);
    }
    cfg
}

/// The JVM options shared by the members and the command-line client:
/// small heaps and quick starts matter more here than peak throughput.
fn jvm_options(heap: &str, log4j: &Path) -> Vec<String> {
    vec![
        format!("-Xmx{heap}"),
        "-XX:+UseSerialGC".into(),
        // The client compiler only: it starts much faster.
        "-XX:TieredStopAtLevel=1".into(),
        "-Xshare:auto".into(),
        // No hsperfdata file in /tmp per JVM.
        "-XX:-UsePerfData".into(),
        "-XX:+ExitOnOutOfMemoryError".into(),
        "-Djava.net.preferIPv4Stack=true".into(),
        format!("-Dlog4j.configuration=file:{}", log4j.display()),
        "-Dzookeeper.jmx.log4j.disable=true".into(),
    ]
}

/// The `java` command line of a member, but for the binary.
pub(crate) fn server_args(install: &Installation, root: &Path, member: &Member) -> Vec<String> {
    let mut args = jvm_options("256m", &root.join(SERVER_LOG4J));
    args.extend([
        // Port 8080, and nothing a test needs.
        "-Dzookeeper.admin.enableServer=false".into(),
        "-Dzookeeper.4lw.commands.whitelist=*".into(),
        "-cp".into(),
        install.classpath.clone(),
        SERVER_MAIN.into(),
        member.dir.join("zoo.cfg").display().to_string(),
    ]);
    args
}

/// The `java` command line of ZooKeeper's command-line client, but for the
/// binary and the command.
pub(crate) fn cli_args(install: &Installation, root: &Path, port: u16) -> Vec<String> {
    let mut args = jvm_options("64m", &root.join(CLI_LOG4J));
    args.extend([
        "-cp".into(),
        install.classpath.clone(),
        "org.apache.zookeeper.ZooKeeperMain".into(),
        "-server".into(),
        format!("127.0.0.1:{port}"),
        // The session timeout asked for; a third of it per connection
        // attempt before the command fails with ConnectionLoss.
        "-timeout".into(),
        "10000".into(),
    ]);
    args
}

/// Copy the directory tree `from` to `to` (created; files and folders
/// only, as ZooKeeper's data directory holds).
pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to).map_err(io_err(format!("creating {}", to.display())))?;
    let entries = std::fs::read_dir(from).map_err(io_err(format!("reading {}", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io_err(format!("reading {}", from.display())))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if source.is_dir() {
            copy_dir(&source, &target)?;
        } else {
            std::fs::copy(&source, &target)
                .map_err(io_err(format!("copying {}", source.display())))?;
        }
    }
    Ok(())
}

/// Create a directory only its owner can read. Fails when it exists
/// already.
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}
