//! `tenure serve`: leader election for services in any language.
//!
//! `tenure run` serves programs that may run only while they lead. Many
//! services instead run on every replica all the time and switch
//! *behaviour* on leadership (a scheduler thread that acts on one replica
//! only). For them this command campaigns for each named election and
//! answers, over HTTP on localhost ([`crate::api`]), whether this replica
//! leads.
//!
//! The usual "leader-elector" sidecar hands out a boolean, which is unsafe
//! the moment it is read: the answer may be stale by the time the program
//! acts. Every answer here carries what makes acting safe instead:
//! - `deadline_ms`, how long this instance may still act, computed from the
//!   term's local deadline at the moment of the answer. A client counts it
//!   down on its own clock and stops at zero, so a sidecar that dies, a
//!   stream that breaks or a store that stops answering can only make it
//!   stop sooner, never act later;
//! - `token`, the term's fencing token, for writes that a resource can
//!   refuse when a newer leader wrote first (the only protection against a
//!   program paused between its check and its write).
//!
//! The seats, one per election, are in [`crate::seat`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tenure::Election;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;
use crate::contest::Contest;
use crate::exit::{self, Failure};
use crate::http;
use crate::seat::{Open, Seat, Seats};

pub async fn serve(args: ServeArgs) -> Result<i32, Failure> {
    let token = auth_token(&args)?;
    if !args.listen.ip().is_loopback() && token.is_none() {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--listen {} is not a loopback address: give --auth-token-file (or \
                 TENURE_AUTH_TOKEN) so that only holders of the token can resign",
                args.listen
            ),
        ));
    }
    check_elections(&args)?;
    let metrics = http::install_recorder()?;
    let id = args.term.id.clone().unwrap_or_else(tenure::instance_id);
    let shutdown = CancellationToken::new();
    // Listening before any seat campaigns: a term is never left to lapse
    // because a signal came early.
    let signals = crate::run::shutdown_signals();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            signals.await;
            tracing::info!("shutdown requested; resigning");
            shutdown.cancel();
        }
    });
    // The API answers from the start, while the store is still being
    // reached: the app beside this sidecar runs (as a follower) even while
    // the store is down, and `/readyz` says why it is not ready.
    let settings = Arc::new(args);
    let mut tasks = JoinSet::new();
    let seats = start_seats(&settings, &id, &shutdown, &mut tasks);
    let args = settings;
    let seats: Seats = Arc::new(seats);
    let (bound, connections) = crate::api::listen(args.listen, seats, token, metrics).await?;
    tracing::info!(addr = %bound, elections = ?args.elections, %id, "serving leader election");
    let failure = wait_for_seats(&mut tasks, &shutdown).await;
    // Every view's sender is gone with its seat: each event stream sends
    // its last event (the term ended) and closes. Give them a moment to be
    // written.
    connections.close();
    if tokio::time::timeout(Duration::from_secs(1), connections.wait())
        .await
        .is_err()
    {
        tracing::debug!("some HTTP connections were still open at exit");
    }
    match failure {
        Some(failure) => Err(failure),
        None => Ok(exit::OK),
    }
}

/// Check the election names before the port is bound: each a name the
/// library takes, none ending like an API path, none given twice.
fn check_elections(args: &ServeArgs) -> Result<(), Failure> {
    for name in &args.elections {
        // The library's own check, before the port is bound.
        tenure::validate_name(&args.redis.prefix, name)?;
        for index in 0..args.slots.unwrap_or(0) as usize {
            tenure::validate_name(
                &args.redis.prefix,
                &tenure::Semaphore::permit_election(name, index),
            )?;
        }
        if name.ends_with("/events") || name.ends_with("/resign") {
            return Err(Failure::new(
                exit::USAGE,
                format!(
                    "--election {name:?} ends like one of the API's paths \
                     (/events, /resign); choose another name"
                ),
            ));
        }
    }
    let mut names = args.elections.clone();
    names.sort();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Failure::new(
            exit::USAGE,
            format!("--election {} is given twice", twice[0]),
        ));
    }
    Ok(())
}

/// Start a seat for each election of `settings` in `tasks`, each campaigning
/// under `id`; the stores are connected once, by the first seat to open.
fn start_seats(
    settings: &Arc<ServeArgs>,
    id: &str,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<Result<(), Failure>>,
) -> BTreeMap<String, Seat> {
    let max_deadline = settings.max_deadline;
    let store = Arc::new(tokio::sync::OnceCell::<tenure::Store>::new());
    let mut seats = BTreeMap::new();
    for name in &settings.elections {
        let open: Open = {
            let (settings, store, name, id) = (
                settings.clone(),
                store.clone(),
                name.clone(),
                id.to_string(),
            );
            Arc::new(move || {
                let (settings, store, name, id) =
                    (settings.clone(), store.clone(), name.clone(), id.clone());
                Box::pin(async move {
                    let store = store.get_or_try_init(|| settings.redis.connect()).await?;
                    build_contest(&settings, store, &name, &id).await
                })
            })
        };
        let seat = Seat::start(name, id, max_deadline, open, shutdown, tasks);
        seats.insert(name.clone(), seat);
    }
    seats
}

/// Wait until every seat has ended. A seat ends only on shutdown, or on
/// an error that needs a person (credentials, ACL, foreign data): then the
/// whole command fails, loudly, so that its supervisor shows why; the
/// other seats resign. The first such failure.
async fn wait_for_seats(
    tasks: &mut JoinSet<Result<(), Failure>>,
    shutdown: &CancellationToken,
) -> Option<Failure> {
    let mut failure = None;
    while let Some(ended) = tasks.join_next().await {
        let err = match ended {
            Ok(Ok(())) => continue,
            Ok(Err(err)) => err,
            Err(join) => Failure::new(exit::INTERNAL, format!("an election task failed: {join}")),
        };
        shutdown.cancel();
        failure.get_or_insert(err);
    }
    failure
}

/// The bearer token for POST requests, if one is configured.
fn auth_token(args: &ServeArgs) -> Result<Option<String>, Failure> {
    let token = match (&args.auth_token_file, std::env::var("TENURE_AUTH_TOKEN")) {
        (Some(_), Ok(_)) => {
            return Err(Failure::new(
                exit::USAGE,
                "give the bearer token by --auth-token-file or by TENURE_AUTH_TOKEN, not both",
            ))
        }
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::new(
                    exit::USAGE,
                    format!("cannot read --auth-token-file {}: {e}", path.display()),
                )
            })?;
            let token = text.strip_suffix('\n').unwrap_or(&text);
            let token = token.strip_suffix('\r').unwrap_or(token);
            if token.is_empty() {
                return Err(Failure::new(
                    exit::USAGE,
                    format!("--auth-token-file {} is empty", path.display()),
                ));
            }
            token.to_string()
        }
        (None, Ok(token)) if !token.is_empty() => token,
        (None, _) => return Ok(None),
    };
    // An Authorization header carries visible ASCII only (RFC 9110's
    // field values, RFC 6750's b64token): any other token could never be
    // matched, so every POST would be refused.
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Failure::new(
            exit::USAGE,
            "the bearer token may hold only visible ASCII characters (no white space, \
             control or non-ASCII characters): an HTTP header cannot carry others",
        ));
    }
    if let Some(path) = &args.auth_token_file {
        crate::password::warn_if_world_readable("--auth-token-file", path);
    }
    Ok(Some(token))
}

/// The election `name`, or with `--slots N` the semaphore of that name.
async fn build_contest(
    args: &ServeArgs,
    store: &tenure::Store,
    name: &str,
    id: &str,
) -> tenure::Result<Contest> {
    let builder = Election::builder(name)
        .store(store)
        .prefix(&args.redis.prefix)
        .allow_eviction(args.redis.allow_eviction);
    // One id for every election of this process (given or made here).
    Contest::build(args.term.apply(builder).id(id), args.slots).await
}
