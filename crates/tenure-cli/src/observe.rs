//! `tenure status` and `tenure watch`: looking at elections without taking part.
//!
//! `status` lists every election it can read. An entry it cannot read (a
//! stray key such as `tenure:{bad name}:lease`, or a lease of a foreign
//! type) does not hide the others: it is listed as unreadable, its reason
//! goes to stderr, and the exit status is 69 once everything is printed, so
//! that a monitoring script notices that someone else's data sits under
//! tenure's prefix. A node that cannot be read (a silent cluster primary)
//! hides none of the others either: the elections of the nodes that answer
//! are listed, the silent node is named (`unreadable_nodes` in `--json`,
//! a line on stderr), and the exit status is 69.

use std::time::SystemTime;

use futures_util::StreamExt;
use serde::Serialize;
use tenure::{Election, LeaderInfo};

use crate::cli::{StatusArgs, WatchArgs};
use crate::complain;
use crate::contest::Contest;
use crate::exit::{self, Failure};

/// One election in `status --json`. Field names are a stable contract.
#[derive(Debug, Serialize)]
struct ElectionStatus {
    name: String,
    leader: Option<LeaderStatus>,
    /// Why the election could not be read; `leader` is then null.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct LeaderStatus {
    id: String,
    token: u64,
    /// RFC 3339, by the Redis server's clock.
    held_since: Option<String>,
    ttl_left_ms: u64,
}

impl From<LeaderInfo> for LeaderStatus {
    fn from(info: LeaderInfo) -> Self {
        LeaderStatus {
            id: info.id,
            token: info.token,
            held_since: info.held_since.map(rfc3339),
            ttl_left_ms: info.ttl_left.as_millis() as u64,
        }
    }
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// A semaphore in `status --slots N --json`: how many of its permits are
/// held. Field names are a stable contract.
#[derive(Debug, Serialize)]
struct SemaphoreStatus {
    name: String,
    permits: usize,
    held: usize,
    /// Permits whose lease could not be read (neither held nor free).
    unreadable: usize,
}

/// A node whose elections could not be listed, in `status --json`.
#[derive(Debug, Serialize)]
struct UnreadNode {
    node: String,
    error: String,
}

pub async fn status(args: StatusArgs) -> Result<i32, Failure> {
    // A name no election can have is the user's mistake (exit 2), not an
    // unreadable entry in the store (69).
    for name in &args.names {
        tenure::validate_name(&args.redis.prefix, name)?;
    }
    let semaphores = semaphores(&args);
    for permit in semaphores.iter().flat_map(|(_, permits)| permits) {
        tenure::validate_name(&args.redis.prefix, permit)?;
    }
    let store = args.redis.connect().await?;
    let (names, unread) = election_names(&args, &store, &semaphores).await?;
    let rows = read_rows(&args, &store, names, &unread).await?;
    // The rows are the permits' elections, semaphore after semaphore.
    let mut rest = rows.as_slice();
    let mut summaries = Vec::new();
    for (name, permits) in &semaphores {
        let (own, later) = rest.split_at(permits.len().min(rest.len()));
        rest = later;
        summaries.push(SemaphoreStatus {
            name: name.clone(),
            permits: permits.len(),
            held: own.iter().filter(|row| row.leader.is_some()).count(),
            unreadable: own.iter().filter(|row| row.error.is_some()).count(),
        });
    }
    let semaphores = summaries;
    print_status(&args, &rows, &unread, &semaphores);
    let mut unreadable = 0;
    for row in &rows {
        if let Some(error) = &row.error {
            unreadable += 1;
            complain!(
                "tenure: election {:?} is unreadable: {}",
                row.name,
                printable(error)
            );
        }
    }
    Ok(if unreadable == 0 && unread.is_empty() {
        exit::OK
    } else {
        exit::UNAVAILABLE
    })
}

/// With `--slots N`, each name given and its permits' elections, in
/// order; else none.
fn semaphores(args: &StatusArgs) -> Vec<(String, Vec<String>)> {
    let Some(slots) = args.slots else {
        return Vec::new();
    };
    let mut names: Vec<&String> = Vec::new();
    for name in &args.names {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let permits = (0..slots as usize)
                .map(|index| tenure::Semaphore::permit_election(name, index))
                .collect();
            (name.clone(), permits)
        })
        .collect()
}

/// The elections to show: the permits of the semaphores named, those
/// named, or every election in the store (sorted), with the nodes whose
/// elections could not be listed.
async fn election_names(
    args: &StatusArgs,
    store: &tenure::Store,
    semaphores: &[(String, Vec<String>)],
) -> Result<(Vec<String>, Vec<UnreadNode>), Failure> {
    let mut unread = Vec::new();
    let names = if !semaphores.is_empty() {
        semaphores
            .iter()
            .flat_map(|(_, permits)| permits.iter().cloned())
            .collect()
    } else if args.names.is_empty() {
        let mut names = Vec::new();
        for (node, listed) in store.elections_by_node(&args.redis.prefix).await? {
            match listed {
                Ok(found) => names.extend(found),
                Err(err) => unread.push(UnreadNode {
                    node,
                    error: err.to_string(),
                }),
            }
        }
        names.sort();
        names.dedup();
        names
    } else {
        args.names.clone()
    };
    Ok((names, unread))
}

/// Each election's leader, or why it could not be read; an error when the
/// store could not be read at all.
async fn read_rows(
    args: &StatusArgs,
    store: &tenure::Store,
    names: Vec<String>,
    unread: &[UnreadNode],
) -> Result<Vec<ElectionStatus>, Failure> {
    let mut rows = Vec::new();
    for name in names {
        let row = match store.leader_of(&args.redis.prefix, &name).await {
            Ok(leader) => ElectionStatus {
                name,
                leader: leader.map(LeaderStatus::from),
                error: None,
            },
            // The connection is gone: every further entry would fail too.
            Err(err) if err.is_transient() && unread.is_empty() && rows.is_empty() => {
                return Err(err.into())
            }
            Err(err) => ElectionStatus {
                name,
                leader: None,
                error: Some(err.to_string()),
            },
        };
        rows.push(row);
    }
    Ok(rows)
}

/// Say which nodes were unreadable, then print the rows as a table or as
/// JSON (`--json`).
fn print_status(
    args: &StatusArgs,
    rows: &[ElectionStatus],
    unread: &[UnreadNode],
    semaphores: &[SemaphoreStatus],
) {
    for node in unread {
        complain!(
            "tenure: the elections on node {} are unreadable: {}",
            node.node,
            printable(&node.error)
        );
    }
    if args.json {
        let mut json = serde_json::json!({ "elections": rows, "unreadable_nodes": unread });
        if args.slots.is_some() {
            json["semaphores"] = serde_json::json!(semaphores);
        }
        crate::output::line(&json.to_string());
    } else if !semaphores.is_empty() {
        let mut text = table(rows);
        for semaphore in semaphores {
            let unreadable = match semaphore.unreadable {
                0 => String::new(),
                n => format!(" ({n} unreadable)"),
            };
            text.push_str(&format!(
                "{}: {} of {} permits held{unreadable}\n",
                semaphore.name, semaphore.held, semaphore.permits
            ));
        }
        crate::output::text(&text);
    } else if !unread.is_empty() {
        let mut text = table(rows);
        for node in unread {
            text.push_str(&format!("(elections on {}: unreadable)\n", node.node));
        }
        crate::output::text(&text);
    } else if rows.is_empty() {
        crate::output::line(&format!(
            "no elections with a leader under prefix {:?}",
            args.redis.prefix
        ));
    } else {
        crate::output::text(&table(rows));
    }
}

fn table(rows: &[ElectionStatus]) -> String {
    let header = ["ELECTION", "LEADER", "TOKEN", "HELD SINCE", "TTL LEFT"];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|row| match &row.leader {
            _ if row.error.is_some() => [
                printable(&row.name),
                "(unreadable)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
            Some(l) => [
                printable(&row.name),
                printable(&l.id),
                l.token.to_string(),
                l.held_since.clone().unwrap_or_else(|| "-".into()),
                format!("{:.1}s", l.ttl_left_ms as f64 / 1000.0),
            ],
            None => [
                printable(&row.name),
                "(none)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |row: [&str; 5]| {
        let mut out = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header);
    for row in &cells {
        out.push_str(&line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
    }
    out
}

pub async fn watch(args: WatchArgs) -> Result<i32, Failure> {
    tenure::validate_name(&args.redis.prefix, &args.name)?;
    // Watching only reads: an eviction policy is warned about, not refused.
    let builder = Election::builder(&args.name)
        .open(args.redis.store())
        .prefix(&args.redis.prefix)
        .allow_eviction(true);
    let contest = Contest::build(builder, args.slots).await?;
    // Every election's changes (a semaphore's permits), each with its name.
    let mut changes =
        futures_util::stream::select_all(contest.elections().iter().map(|election| {
            let name = election.name().to_string();
            Box::pin(election.watch().map(move |change| (name.clone(), change)))
        }));
    let mut interrupted = Box::pin(tenure::shutdown_signal());
    let mut reader_gone = Box::pin(crate::output::stdout_closed());
    loop {
        let change = tokio::select! {
            change = changes.next() => change,
            _ = &mut interrupted => return Ok(exit::OK),
            _ = &mut reader_gone => return Ok(exit::OK),
        };
        let Some((name, change)) = change else {
            return Ok(exit::OK);
        };
        let now = rfc3339(SystemTime::now());
        let text = match change {
            Ok(leader) if args.json => {
                let mut json = serde_json::json!({
                    "time": now,
                    "election": name,
                    "leader": leader.as_ref().map(|l| &l.id),
                    "token": leader.as_ref().map(|l| l.token),
                });
                if args.slots.is_some() {
                    json["semaphore"] = serde_json::json!(args.name);
                }
                json.to_string()
            }
            Ok(Some(leader)) => format!(
                "{now}  {name}  leader {}  token {}",
                printable(&leader.id),
                leader.token
            ),
            Ok(None) => format!("{now}  {name}  no leader"),
            Err(err) => {
                complain!("{now}  {name}  cannot read the lease: {err}");
                continue;
            }
        };
        if !crate::output::line(&text) {
            // Whoever read our output is gone (a closed pipe).
            return Ok(exit::OK);
        }
    }
}

/// An id read from the store, safe to print: control characters (a
/// newline, an ANSI escape) in a forged lease must not forge output lines.
fn printable(id: &str) -> String {
    if id.chars().any(char::is_control) {
        id.escape_debug().to_string()
    } else {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_with_control_characters_cannot_forge_lines() {
        assert_eq!(printable("host-a"), "host-a");
        let forged = printable("x\nreports  evil  1\u{1b}[2J");
        assert!(!forged.chars().any(char::is_control), "{forged}");
    }

    #[test]
    fn the_table_aligns_columns_and_marks_empty_elections() {
        let rows = vec![
            ElectionStatus {
                name: "reports".into(),
                leader: Some(LeaderStatus {
                    id: "host-a".into(),
                    token: 42,
                    held_since: Some("2026-11-29T10:00:00.000Z".into()),
                    ttl_left_ms: 12_345,
                }),
                error: None,
            },
            ElectionStatus {
                name: "cleanup-nightly".into(),
                leader: None,
                error: None,
            },
            ElectionStatus {
                name: "stray".into(),
                leader: None,
                error: Some("key holds data tenure did not write".into()),
            },
        ];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("ELECTION         LEADER"));
        assert!(lines[1].contains("host-a") && lines[1].ends_with("12.3s"));
        assert!(lines[2].starts_with("cleanup-nightly  (none)"));
        assert!(lines[3].starts_with("stray            (unreadable)"));
    }
}
