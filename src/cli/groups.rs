//! Commands on action groups: `groups limit` (set or clear a group's limits) and
//! `groups limits` (list them). See [`crate::limits`] for what the limits mean.

use super::args::fmt_time;
use super::table::{truncate, Table};
use super::{CliError, Output};
use crate::limits::{GroupLimit, RateLimit};
use crate::Queue;
use clap::{ArgGroup, Args, Subcommand};
use serde::Serialize;

/// The `dockhand groups` subcommands.
#[derive(Debug, Subcommand)]
pub enum GroupsCommand {
    /// Set or clear the limits of an action group, for every runner on the database.
    ///
    /// --concurrency N: at most N actions of the group running at once (actions a runner has
    /// claimed ahead into its buffer count as running). --rate N/PERIOD: at most N starts in
    /// any window of PERIOD (10/s, 100/5m, 3/250ms). Setting replaces both limits (one left
    /// out is removed); --clear removes them and releases the group's waiting actions.
    Limit(LimitArgs),
    /// List the limited groups with their running actions and recent starts.
    Limits,
}

/// Options of `dockhand groups limit`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true)
    .args(["concurrency", "rate", "clear"])))]
pub struct LimitArgs {
    /// The action group.
    pub group: String,
    /// At most this many running actions of the group (at least 1).
    #[arg(long, value_name = "N")]
    pub concurrency: Option<u32>,
    /// At most N starts per PERIOD, e.g. 10/s, 100/5m, 3/250ms.
    #[arg(long, value_name = "N/PERIOD", value_parser = parse_rate)]
    pub rate: Option<RateLimit>,
    /// Remove the group's limits.
    #[arg(long, conflicts_with_all = ["concurrency", "rate"])]
    pub clear: bool,
}

/// The clap parser of `--rate` (the library's message, naming the field).
fn parse_rate(text: &str) -> Result<RateLimit, String> {
    text.parse::<RateLimit>().map_err(|e| e.to_string())
}

/// Runs a `dockhand groups` subcommand.
pub(crate) async fn run(q: &Queue, command: GroupsCommand, out: Output) -> Result<(), CliError> {
    match command {
        GroupsCommand::Limit(a) => limit(q, a, out).await,
        GroupsCommand::Limits => list(q, out).await,
    }
}

#[derive(Serialize)]
struct Changed<'a> {
    group: &'a str,
    limit: Option<GroupLimit>,
    changed: bool,
}

async fn limit(q: &Queue, a: LimitArgs, out: Output) -> Result<(), CliError> {
    if a.clear {
        let changed = q.store().clear_group_limit(&a.group).await?;
        let r = Changed {
            group: &a.group,
            limit: None,
            changed,
        };
        return out.emit(&r, || {
            if changed {
                format!("group {}: limits cleared\n", a.group)
            } else {
                format!("group {} had no limits\n", a.group)
            }
        });
    }
    let limit = GroupLimit {
        concurrency: a.concurrency,
        rate: a.rate,
    };
    let new = q
        .store()
        .set_group_limit(&a.group, &limit, "cli", q.clock().now())
        .await?;
    let r = Changed {
        group: &a.group,
        limit: Some(limit),
        changed: true,
    };
    out.emit(&r, || {
        let verb = if new { "limited to" } else { "now limited to" };
        format!("group {} {verb} {limit}\n", a.group)
    })
}

async fn list(q: &Queue, out: Output) -> Result<(), CliError> {
    let rows = q.group_limits().await?;
    out.emit(&rows, || {
        if rows.is_empty() {
            return "no group has limits\n".into();
        }
        let mut t = Table::new(&[
            "GROUP",
            "CONCURRENCY",
            "RUNNING",
            "RATE",
            "RECENT STARTS",
            "SET",
            "BY",
        ])
        .right_align(&[1, 2, 4]);
        for l in &rows {
            t.row(vec![
                truncate(&l.group, 32),
                l.limit
                    .concurrency
                    .map_or_else(|| "-".into(), |n| n.to_string()),
                l.running.to_string(),
                l.limit.rate.map_or_else(|| "-".into(), |r| r.to_string()),
                if l.limit.rate.is_some() {
                    l.recent_starts.to_string()
                } else {
                    "-".into()
                },
                fmt_time(l.set_at),
                truncate(&l.set_by, 24),
            ]);
        }
        t.render()
    })
}
