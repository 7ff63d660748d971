//! The HTTP API of `tenure serve`. Its paths and JSON fields are a
//! contract: programs in any language depend on them.
//!
//! - `GET /v1/elections/NAME`: `{"election", "is_leader", "token", "leader",
//!   "deadline_ms"}`, computed at the moment of the answer (with `--slots`,
//!   plus `"permit"` while this instance holds one);
//! - `GET /v1/elections/NAME/events`: the same, as server-sent events, one
//!   per change (a term begins, this instance's term is renewed, a term
//!   ends, another holder is seen), ending after the event that ends the
//!   term the stream began in;
//! - `POST /v1/elections/NAME/resign[?rejoin=now]`;
//! - `GET /v1/elections`: the names served;
//! - `GET /healthz`, `GET /readyz[?leader=NAME]`, `GET /metrics`.
//!
//! The one rule for clients: act only while `deadline_ms > 0`, counted down
//! on the client's own clock from the moment the answer arrived, and pass
//! `token` to fenced writes. Everything here serves that rule: `deadline_ms`
//! is read from the term's local deadline when the answer is written (not
//! from a cached flag), is rounded down, and is 0 as soon as the term may no
//! longer act, whether or not the seat has noticed yet.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use tokio_util::task::TaskTracker;

use crate::exit::Failure;
use crate::http::{self, Body, Handler, Limits};
use crate::seat::{Rejoin, Resigned, Seat, Seats, View};

/// How often an idle event stream carries a comment, so that proxies and
/// clients can tell a quiet stream from a dead one.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A seat whose term passed its deadline this long ago without the seat
/// noticing is wedged (`/healthz` fails).
const WEDGED_AFTER: Duration = Duration::from_secs(2);

/// Bind `addr` and serve the API for `seats` in the background. The
/// tracker counts open connections: event streams end when their seat's
/// views end, so a shutdown can wait for the last event to be written.
pub async fn listen(
    addr: SocketAddr,
    seats: Seats,
    bearer: Option<String>,
    metrics: PrometheusHandle,
) -> Result<(SocketAddr, TaskTracker), Failure> {
    let api = Arc::new(Api {
        seats,
        bearer,
        metrics,
        streams: Arc::new(Semaphore::new(MAX_STREAMS)),
    });
    let handler: Handler = Arc::new(move |request| {
        let api = api.clone();
        Box::pin(async move { api.answer(request).await })
    });
    let limits = Limits {
        // Every worker of every election may hold an event stream.
        max_connections: 256,
        header_read: Duration::from_secs(5),
        // Event streams are closed after this too; clients reconnect and
        // get the current state first.
        lifetime: Duration::from_secs(600),
    };
    http::listen(addr, "the API", handler, limits).await
}

struct Api {
    seats: Seats,
    bearer: Option<String>,
    metrics: PrometheusHandle,
    /// Event streams open at once; the other connections stay free for
    /// short requests (`/healthz`, a resign).
    streams: Arc<Semaphore>,
}

/// At most this many event streams are served at once: half the
/// connections, so that streams whose clients never read cannot lock out
/// health checks and resigns.
pub const MAX_STREAMS: usize = 128;

/// What a request under `/v1/elections/` asks for.
enum Route<'a> {
    State(&'a Seat),
    Events(&'a Seat),
    Resign(&'a Seat),
}

impl Api {
    async fn answer<B>(&self, request: Request<B>) -> Response<Body> {
        let path = request.uri().path();
        let query = request.uri().query().unwrap_or("");
        // HEAD is GET without the body (hyper leaves it out), for probes
        // that use it.
        let method = match request.method() {
            &Method::HEAD => &Method::GET,
            method => method,
        };
        match path {
            "/healthz" | "/readyz" | "/metrics" | "/v1/elections" if method != Method::GET => {
                return error(StatusCode::METHOD_NOT_ALLOWED, "use GET");
            }
            "/healthz" => return self.healthz(),
            "/readyz" => return self.readyz(query),
            "/metrics" => return http::text(StatusCode::OK, self.metrics.render()),
            "/v1/elections" => {
                let names: Vec<&String> = self.seats.keys().collect();
                return json_response(StatusCode::OK, &json!({ "elections": names }));
            }
            _ => {}
        }
        let Some(route) = path
            .strip_prefix("/v1/elections/")
            .map(|rest| self.route(rest))
        else {
            return error(StatusCode::NOT_FOUND, "no such path");
        };
        let route = match route {
            Ok(route) => route,
            Err(name) => {
                return error(StatusCode::NOT_FOUND, &format!("unknown election {name:?}"))
            }
        };
        match (route, method) {
            (Route::State(seat), &Method::GET) => {
                let view = seat.view.borrow().clone();
                let body = format!("{}\n", to_json(&state(seat, &view)));
                http::respond(StatusCode::OK, "application/json", body)
            }
            (Route::Events(seat), &Method::GET) => match self.streams.clone().try_acquire_owned() {
                Ok(slot) => events(seat.clone(), slot),
                Err(_) => error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("{MAX_STREAMS} event streams are open, the most served at once; poll GET /v1/elections/NAME, or try again later"),
                ),
            },
            (Route::Resign(seat), &Method::POST) => {
                if !self.authorized(&request) {
                    return unauthorized();
                }
                let rejoin = match param(query, "rejoin").as_deref() {
                    None | Some("ttl") => Rejoin::AfterTtl,
                    Some("now") => Rejoin::Now,
                    Some(other) => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            &format!("rejoin={other:?}: use rejoin=now, or leave it out to campaign again after one ttl"),
                        )
                    }
                };
                match seat.resign(rejoin).await {
                    Resigned::Term(token) => json_response(
                        StatusCode::OK,
                        &json!({ "election": seat.name, "resigned": true, "token": token }),
                    ),
                    Resigned::NotLeading => error(
                        StatusCode::CONFLICT,
                        &format!("this instance does not lead {:?}", seat.name),
                    ),
                    Resigned::Failed(why) => error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("the term ended, but its lease could not be released (it lapses at its ttl): {why}"),
                    ),
                }
            }
            (Route::Resign(_), _) => error(StatusCode::METHOD_NOT_ALLOWED, "use POST"),
            (_, _) => error(StatusCode::METHOD_NOT_ALLOWED, "use GET"),
        }
    }

    /// The seat a path below `/v1/elections/` names, or the name not found.
    /// A name is percent-decoded, and may itself contain `/`.
    fn route<'a>(&'a self, rest: &str) -> Result<Route<'a>, String> {
        let seat = |raw: &str| {
            let name = decode(raw);
            self.seats.get(&name).ok_or(name)
        };
        if let Ok(found) = seat(rest) {
            return Ok(Route::State(found));
        }
        if let Some(name) = rest.strip_suffix("/events") {
            return seat(name).map(Route::Events);
        }
        if let Some(name) = rest.strip_suffix("/resign") {
            return seat(name).map(Route::Resign);
        }
        Err(decode(rest))
    }

    /// Whether a POST may proceed: always without a configured token; else
    /// only with `Authorization: Bearer TOKEN`.
    fn authorized<B>(&self, request: &Request<B>) -> bool {
        let Some(expected) = &self.bearer else {
            return true;
        };
        // Every Authorization header is tried; the scheme is
        // case-insensitive (RFC 7235), the token is compared in constant time.
        request
            .headers()
            .get_all(hyper::header::AUTHORIZATION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .filter_map(|value| value.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .any(|(_, given)| bool::from(given.trim().as_bytes().ct_eq(expected.as_bytes())))
    }

    fn healthz(&self) -> Response<Body> {
        let now = Instant::now();
        for seat in self.seats.values() {
            let view = seat.view.borrow();
            if let Some(term) = &view.term {
                if now > term.deadline() + WEDGED_AFTER {
                    return http::text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "wedged: election {:?} still holds term {} {:?} past its deadline\n",
                            seat.name,
                            term.token(),
                            now - term.deadline()
                        ),
                    );
                }
            }
        }
        http::text(StatusCode::OK, "ok\n")
    }

    fn readyz(&self, query: &str) -> Response<Body> {
        let Some(name) = param(query, "leader") else {
            let waiting: Vec<&str> = self
                .seats
                .values()
                .filter(|seat| !seat.view.borrow().ready)
                .map(|seat| seat.name.as_str())
                .collect();
            if waiting.is_empty() {
                return http::text(StatusCode::OK, "ready\n");
            }
            return http::text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: the store was not reached yet for {waiting:?}\n"),
            );
        };
        let Some(seat) = self.seats.get(&name) else {
            return error(StatusCode::NOT_FOUND, &format!("unknown election {name:?}"));
        };
        // The same rule as `is_leader` in a GET, so the two never disagree
        // (during a resign's wait the term still holds the lease, but no
        // longer hands out time).
        let leads = seat
            .view
            .borrow()
            .term
            .as_ref()
            .is_some_and(|term| seat.granting(term));
        if leads {
            http::text(StatusCode::OK, "leader\n")
        } else {
            http::text(StatusCode::SERVICE_UNAVAILABLE, "not the leader\n")
        }
    }
}

/// The contract's JSON object, fields in the documented order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct State<'a> {
    pub election: &'a str,
    pub is_leader: bool,
    pub token: Option<u64>,
    pub leader: Option<&'a str>,
    pub deadline_ms: Option<u64>,
    /// With `--slots`: the permit (its election) this instance holds while
    /// `is_leader`; left out otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit: Option<&'a str>,
}

/// The state of `seat` as of now.
pub fn state<'a>(seat: &'a Seat, view: &'a View) -> State<'a> {
    let (leading, token, left, permit) = match &view.term {
        Some(term) => {
            let left = seat.grant(term).as_millis() as u64;
            let leading = left > 0;
            // A permit's election is the semaphore's name and more.
            let permit = Some(term.election()).filter(|held| leading && *held != seat.name);
            (leading, leading.then(|| term.token()), Some(left), permit)
        }
        None => (false, None, None, None),
    };
    let leader = if leading {
        Some(seat.id.as_str())
    } else {
        view.holder.as_ref().map(|(id, _)| id.as_str())
    };
    State {
        election: &seat.name,
        is_leader: leading,
        token,
        leader,
        deadline_ms: left,
        permit,
    }
}

fn to_json(state: &State<'_>) -> String {
    // Serializing plain strings and numbers cannot fail.
    serde_json::to_string(state).unwrap_or_default()
}

/// The term a view shows, for an event stream: whether this instance
/// leads in it, its holder (id, token), and while leading the election
/// the term is of (a semaphore's permits count tokens each on their own,
/// so a token alone does not name a term). Read without handing out time.
type Shown = (bool, Option<(String, u64)>, Option<String>);

fn term_of(seat: &Seat, view: &View) -> Shown {
    match &view.term {
        Some(term) if seat.granting(term) => (
            true,
            Some((seat.id.clone(), term.token())),
            Some(term.election().to_string()),
        ),
        _ => (false, view.holder.clone(), None),
    }
}

/// An event stream's state between its frames (see [`events`]).
struct EventStream {
    seat: Seat,
    began_in: Option<Shown>,
    /// The term the last event showed.
    said: Option<Shown>,
    /// When to repeat the state (while leading).
    refresh: Option<Instant>,
    done: bool,
    keep_alive: tokio::time::Interval,
    /// Held for as long as the stream lives.
    _slot: OwnedSemaphorePermit,
}

impl EventStream {
    /// The event `view` calls for: one when the term it shows changed or
    /// the state is due to be repeated, else `None`. The event that shows
    /// another term than the stream began in is its last.
    fn event(&mut self, view: &View) -> Option<Bytes> {
        let term = term_of(&self.seat, view);
        let due = self.refresh.is_some_and(|at| Instant::now() >= at);
        if self.said.as_ref() != Some(&term) || due {
            let began_in = self.began_in.get_or_insert_with(|| term.clone());
            self.done = *began_in != term;
            let event = state(&self.seat, view);
            self.refresh = event
                .is_leader
                .then(|| Instant::now() + self.seat.max_deadline / 3);
            self.said = Some(term);
            let frame = format!("data: {}\n\n", to_json(&event));
            return Some(Bytes::from(frame));
        }
        None
    }

    /// With nothing new: when to look again without a change, the time to
    /// repeat the state or the deadline of this instance's term (it may no
    /// longer act then, whether or not the seat has noticed).
    fn wake(&self, view: &View) -> Option<Instant> {
        let deadline = view
            .term
            .as_ref()
            .filter(|term| term.is_leader())
            .map(|term| term.deadline());
        match (deadline, self.refresh) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The event stream of `seat`: its state now, then one event per change,
/// until the event that ends the term it began in. While this instance
/// leads, the state is repeated every third of `--max-deadline`, so that
/// a client's deadline is renewed long before it runs out.
fn events(seat: Seat, slot: OwnedSemaphorePermit) -> Response<Body> {
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.reset();
    let stream = EventStream {
        seat,
        began_in: None,
        said: None,
        refresh: None,
        done: false,
        keep_alive,
        _slot: slot,
    };
    let frames = futures_util::stream::unfold(stream, |mut stream| async move {
        if stream.done {
            return None;
        }
        loop {
            let view = stream.seat.view.borrow_and_update().clone();
            if let Some(frame) = stream.event(&view) {
                return Some((frame, stream));
            }
            // Nothing new: wait for a change, the time to repeat the
            // state, the deadline of this instance's term, or the
            // keep-alive.
            let wake = stream.wake(&view);
            let at_wake = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = stream.seat.view.changed() => {
                    if changed.is_err() {
                        // The seat is gone (shutdown): end the stream.
                        return None;
                    }
                }
                _ = at_wake => {}
                _ = stream.keep_alive.tick() => {
                    return Some((Bytes::from_static(b": keep-alive\n\n"), stream));
                }
            }
        }
    });
    let body = BodyExt::boxed(StreamBody::new(frames.map(|bytes| Ok(Frame::data(bytes)))));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    response
}

/// 401, for a POST without this server's bearer token.
fn unauthorized() -> Response<Body> {
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "POST needs the header `Authorization: Bearer TOKEN` with this server's token",
    );
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    response
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    http::respond(status, "application/json", format!("{value}\n"))
}

/// A JSON error: `{"error": "..."}`.
fn error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": message }))
}

fn decode(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

/// The (decoded) value of `key` in a query string.
fn param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k) == key).then(|| decode(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seat::Seat;
    use tokio::task::JoinSet;
    use tokio_util::sync::CancellationToken;

    /// A seat of election "jobs" on `store`, as instance "me", once it leads.
    async fn leading_seat(
        store: &tenure::MemoryStore,
        max_deadline: Duration,
    ) -> (
        Seat,
        tenure::Election,
        CancellationToken,
        JoinSet<Result<(), Failure>>,
    ) {
        let election = tenure::Election::builder("jobs")
            .memory(store)
            .id("me")
            .ttl(Duration::from_secs(3))
            .build()
            .await
            .expect("valid settings");
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let opened = election.clone();
        let open: crate::seat::Open = Arc::new(move || {
            let election = opened.clone();
            Box::pin(async move { Ok(crate::contest::Contest::Election(election)) })
        });
        let seat = Seat::start("jobs", "me", max_deadline, open, &shutdown, &mut tasks);
        let mut view = seat.view.clone();
        view.wait_for(|view| view.term.is_some())
            .await
            .expect("the seat leads");
        (seat, election, shutdown, tasks)
    }

    /// The next event of a stream (keep-alive comments skipped), or `None`
    /// once the server ended it.
    async fn next_event(body: &mut Body) -> Option<serde_json::Value> {
        loop {
            let frame = body.frame().await?.ok()?;
            let data = frame.into_data().ok()?;
            let text = String::from_utf8_lossy(&data).to_string();
            if let Some(json) = text.strip_prefix("data: ") {
                return Some(serde_json::from_str(json.trim()).expect("JSON event"));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaders_stream_repeats_the_state_within_the_max_deadline_and_ends_with_its_term() {
        let store = tenure::MemoryStore::new();
        let max = Duration::from_millis(900);
        let (seat, _election, shutdown, _tasks) = leading_seat(&store, max).await;

        let slot = Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("a slot");
        let mut body = events(seat.clone(), slot).into_body();
        let first = next_event(&mut body).await.expect("the current state");
        let at = Instant::now();
        assert_eq!(first["is_leader"], true, "{first}");
        assert_eq!(first["leader"], "me");
        let token = first["token"].as_u64().expect("a token");
        assert_eq!(first["deadline_ms"], 900, "capped by the max deadline");

        // The state is repeated a third of the max deadline later.
        let again = next_event(&mut body).await.expect("a repeat");
        assert_eq!(again["token"], token);
        assert_eq!(again["is_leader"], true);
        assert_eq!(Instant::now() - at, max / 3);

        // Another instance takes the lease: the term ends, the stream says
        // so and ends.
        store.steal("jobs", "other", Duration::from_secs(30));
        let mut last = again;
        while let Some(event) = next_event(&mut body).await {
            last = event;
        }
        assert_eq!(last["is_leader"], false, "{last}");
        assert_ne!(last["leader"], "me", "{last}");
        shutdown.cancel();
    }

    /// A semaphore's permits count tokens each on their own: a term of
    /// another permit with the same token is not the seat's term. (Were it
    /// taken for it, a stream begun in the first permit's term would not
    /// end when the seat moved to the second, and time could be handed out
    /// in it.)
    #[tokio::test(start_paused = true)]
    async fn a_permits_term_is_named_by_its_election_not_only_its_token() {
        let semaphore = |store: &tenure::MemoryStore, id: &'static str| {
            tenure::Election::builder("jobs")
                .memory(store)
                .id(id)
                .ttl(Duration::from_secs(3))
                .semaphore(2)
        };
        let exports = semaphore(&tenure::MemoryStore::new(), "me")
            .await
            .expect("valid settings");
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let open: crate::seat::Open = Arc::new(move || {
            let exports = exports.clone();
            Box::pin(async move { Ok(crate::contest::Contest::Slots(exports)) })
        });
        let seat = Seat::start(
            "jobs",
            "me",
            Duration::from_secs(1),
            open,
            &shutdown,
            &mut tasks,
        );
        let mut views = seat.view.clone();
        views
            .wait_for(|view| view.term.is_some())
            .await
            .expect("the seat holds a permit");
        let view = seat.view.borrow().clone();
        let held = view.term.clone().expect("a term");
        // A term of the other permit with the same token (here from
        // another store: the seat's own may have counted that permit on).
        let elsewhere = semaphore(&tenure::MemoryStore::new(), "me")
            .await
            .expect("valid settings");
        let other = elsewhere
            .elections()
            .iter()
            .find(|permit| permit.name() != held.election())
            .expect("two permits")
            .campaign()
            .await
            .expect("the other permit");
        assert_eq!(other.token(), held.token());
        assert_ne!(other.election(), held.election());
        assert!(seat.granting(&held));
        assert!(
            !seat.granting(&other),
            "no time handed out in another permit's term"
        );
        let moved = View {
            term: Some(other),
            ..view.clone()
        };
        assert_ne!(
            term_of(&seat, &view),
            term_of(&seat, &moved),
            "a stream sees the seat move to another permit"
        );
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_resign_waits_until_the_deadline_handed_out_has_passed() {
        let store = tenure::MemoryStore::new();
        let max = Duration::from_millis(1500);
        let (seat, election, shutdown, _tasks) = leading_seat(&store, max).await;
        let handed = {
            let view = seat.view.borrow().clone();
            state(&seat, &view).deadline_ms.expect("a deadline")
        };
        assert_eq!(handed, 1500);
        let asked = Instant::now();
        let resigned = seat.resign(crate::seat::Rejoin::AfterTtl).await;
        assert!(matches!(resigned, crate::seat::Resigned::Term(_)));
        assert_eq!(
            Instant::now() - asked,
            max,
            "the lease is released only when the deadline handed out has passed"
        );
        assert!(election.leader().await.expect("reads").is_none());
        // Meanwhile no answer handed out more time.
        let view = seat.view.borrow().clone();
        assert_eq!(state(&seat, &view).deadline_ms, None);
        shutdown.cancel();
    }
}
