//! The `tenure` command: a thin layer over the `tenure` library.
//!
//! - `run` ([`run`]) makes any command a cluster-wide singleton, with
//!   process supervision in [`supervisor`] and [`guardian`] and the
//!   operations endpoint in [`http`];
//! - `status` and `watch` ([`observe`]) look at elections;
//! - `demo` ([`demo`]) shows the whole thing on a private Redis.
#![forbid(unsafe_code)]

mod cli;
mod demo;
mod exit;
mod guardian;
mod http;
mod marker;
mod observe;
mod output;
mod run;
mod supervisor;

use clap::Parser;

use cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    if let Command::Guardian(args) = &cli.command {
        // The guardian must not start a multi-threaded runtime or logging:
        // it starts CMD as fast as it can and then only watches.
        std::process::exit(guardian::main(args));
    }
    let default_log = if matches!(cli.command, Command::Demo(_)) {
        "warn"
    } else {
        "info"
    };
    init_logs(cli.log.as_deref().unwrap_or(default_log));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            output::err_line(&format!("tenure: cannot start the async runtime: {err}"));
            std::process::exit(1);
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => observe::status(args).await,
            Command::Watch(args) => observe::watch(args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::Guardian(_) => Ok(exit::OK),
        }
    });
    // Background tasks (renewal keepers, subscribers) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match outcome {
        Ok(code) => std::process::exit(code),
        Err(failure) => {
            output::err_line(&format!("tenure: {failure}"));
            std::process::exit(failure.code);
        }
    }
}

fn init_logs(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| output::Stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .compact()
        .try_init();
}
