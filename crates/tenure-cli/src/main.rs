//! The `tenure` command: a thin layer over the `tenure` library.
//!
//! - `run` ([`run`]) makes any command a cluster-wide singleton, with
//!   process supervision in [`supervisor`] and [`guardian`] and the
//!   operations endpoint in [`http`];
//! - `serve` ([`serve`]) tells local programs in any language over HTTP
//!   ([`api`]) whether they lead;
//! - `status` and `watch` ([`observe`]) look at elections;
//! - `demo` ([`demo`]) shows the whole thing on a private Redis;
//! - `completions` and `man` print what clap_complete and clap_mangen
//!   make of the command line ([`cli`]), so they cannot drift from `--help`.
//!
//! A `--password-file` is read here, before anything else runs
//! ([`password`]).
#![forbid(unsafe_code)]

mod api;
mod cli;
mod contest;
mod cron;
mod demo;
mod exit;
mod guardian;
mod http;
mod observe;
mod output;
mod password;
mod run;
mod seat;
mod serve;
mod supervisor;
#[cfg(feature = "zookeeper")]
mod zk_cleanup;

use std::ffi::OsStr;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use cli::{Cli, Command, LogFormat};

fn main() {
    let mut cli = parse();
    if let Command::Guardian(args) = &cli.command {
        // The guardian must not start a multi-threaded runtime or logging:
        // it starts CMD as fast as it can and then only watches.
        std::process::exit(guardian::main(args));
    }
    match &cli.command {
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "tenure", &mut script);
            output::text(&String::from_utf8_lossy(&script));
            output::exit(exit::OK);
        }
        Command::Schema {
            store: cli::SchemaStore::Postgres,
        } => {
            output::text(&format!(
                "{}\n-- The least a role needs, once the tables exist:\n-- GRANT {} TO your_role;\n",
                tenure::POSTGRES_SCHEMA.trim_end(),
                tenure::POSTGRES_GRANTS
            ));
            output::exit(exit::OK);
        }
        Command::Man => {
            let mut page = Vec::new();
            if let Err(err) = clap_mangen::Man::new(Cli::command()).render(&mut page) {
                output::err_line(&format!("tenure: cannot render the manual page: {err}"));
                output::exit(1);
            }
            output::text(&String::from_utf8_lossy(&page));
            output::exit(exit::OK);
        }
        _ => {}
    }
    if let Err(failure) = read_password_file(&mut cli.command) {
        output::err_line(&format!("tenure: {failure}"));
        output::exit(failure.code);
    }
    let default_log = if matches!(cli.command, Command::Demo(_)) {
        "warn"
    } else {
        "info"
    };
    init_logs(cli.log.as_deref().unwrap_or(default_log), cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            output::err_line(&format!("tenure: cannot start the async runtime: {err}"));
            output::exit(1);
        }
    };
    let store = store_of(&cli.command).map(tenure::redact_url);
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => observe::status(args).await,
            Command::Watch(args) => observe::watch(args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::Guardian(_)
            | Command::Completions { .. }
            | Command::Man
            | Command::Schema { .. } => Ok(exit::OK),
        }
    });
    // Background tasks (renewal keepers, subscribers) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match outcome {
        Ok(code) => output::exit(code),
        Err(failure) => {
            let failure = failure.naming_store(store.as_deref());
            output::err_line(&format!("tenure: {failure}"));
            output::exit(failure.code);
        }
    }
}

/// The store URL `command` uses, once resolved.
fn store_of(command: &Command) -> Option<&str> {
    match command {
        Command::Run(args) => Some(&args.redis.url),
        Command::Status(args) => Some(&args.redis.url),
        Command::Watch(args) => Some(&args.redis.url),
        Command::Serve(args) => Some(&args.redis.url),
        Command::Demo(args) => args.url.as_deref(),
        Command::Guardian(_)
        | Command::Completions { .. }
        | Command::Man
        | Command::Schema { .. } => None,
    }
}

/// Read the command line. An invalid value that came from a `TENURE_*`
/// variable is reported under the variable's name: clap would name the
/// flag, which the user never typed.
fn parse() -> Cli {
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            if let Some(message) = cli::invalid_variable(&Cli::command(), &err, std::env::args_os())
            {
                output::err_line(&format!("tenure: {message}"));
                output::exit(exit::USAGE);
            }
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                // clap's own exit would ignore a failed write (exit 0 on a
                // full stdout).
                output::checked(err.print());
                output::exit(exit::OK);
            }
            err.exit()
        }
    }
}

/// Put the password of `--password-file` into the URL it is for.
fn read_password_file(command: &mut Command) -> Result<(), exit::Failure> {
    let redis = match command {
        Command::Run(args) => &mut args.redis,
        Command::Status(args) => &mut args.redis,
        Command::Watch(args) => &mut args.redis,
        Command::Serve(args) => &mut args.redis,
        Command::Demo(args) => {
            args.url = cli::store_url(args.url.as_deref(), None);
            if let Some(url) = &args.url {
                args.url = Some(password::apply(url, args.password_file.as_deref())?);
            }
            return Ok(());
        }
        Command::Guardian(_)
        | Command::Completions { .. }
        | Command::Man
        | Command::Schema { .. } => return Ok(()),
    };
    redis.resolve();
    redis
        .check()
        .map_err(|why| exit::Failure::new(exit::USAGE, why))?;
    redis.url = password::apply(&redis.url, redis.password_file.as_deref())?;
    Ok(())
}

/// `filter` was checked when the command line was read (`cli::parse_log_filter`).
fn init_logs(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| output::Stderr)
        .log_internal_errors(false)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => logs
            .with_ansi(colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .compact()
            .try_init(),
        LogFormat::Json => logs.with_ansi(false).json().try_init(),
    };
}

/// Colour log lines on a terminal, unless `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
fn colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_turns_colour_off_unless_empty() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
