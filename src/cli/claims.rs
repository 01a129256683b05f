//! Commands on item claims: `claims list`.

use super::args::{self, fmt_time};
use super::table::{truncate, Table};
use super::{CliError, Output};
use crate::claims::{ClaimFilter, ClaimStatus, ItemClaim};
use crate::{Error, Queue};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

/// The `dockhand claims` subcommands.
#[derive(Debug, Subcommand)]
pub enum ClaimsCommand {
    /// List item claims, oldest first, filtered by scope, owning job and status.
    ///
    /// A claimed item whose expiry has passed is marked `(expired)`: another owner may take it
    /// over. `--job` with an id that owns no claims and does not exist exits with status 1.
    List(ClaimListArgs),
}

/// Options of `dockhand claims list`.
#[derive(Debug, Args)]
pub struct ClaimListArgs {
    /// Only this identity scope, e.g. `shared:feed` or a step id `pipeline/step`.
    #[arg(long, value_name = "S")]
    pub scope: Option<String>,
    /// Only claims owned by this job.
    #[arg(long = "job", value_name = "ID")]
    pub job: Option<i64>,
    /// Only this status: claimed, processed or deferred.
    #[arg(long, value_name = "S", value_parser = args::parse_claim_status)]
    pub status: Option<ClaimStatus>,
    /// At most this many rows.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
}

/// Runs a `dockhand claims` subcommand.
pub(crate) async fn run(q: &Queue, command: ClaimsCommand, out: Output) -> Result<(), CliError> {
    match command {
        ClaimsCommand::List(a) => list(q, &a, out).await,
    }
}

/// The EXPIRES cell: the expiry of a claimed item (marked when passed), `-` otherwise.
pub(crate) fn claim_expiry(c: &ItemClaim, now: DateTime<Utc>) -> String {
    match (c.status, c.expires_at) {
        (ClaimStatus::Claimed, Some(t)) if t <= now => format!("{} (expired)", fmt_time(t)),
        (ClaimStatus::Claimed, Some(t)) => fmt_time(t),
        _ => "-".into(),
    }
}

/// `dockhand claims list`.
async fn list(q: &Queue, a: &ClaimListArgs, out: Output) -> Result<(), CliError> {
    let filter = ClaimFilter {
        scope: a.scope.clone(),
        job_id: a.job,
        status: a.status,
        limit: a.limit,
    };
    let rows = q.store().list_claims(&filter).await?;
    if let (Some(id), true) = (a.job, rows.is_empty()) {
        // An empty answer for a job that does not exist is most likely a mistyped id.
        if q.store().get_job(id).await?.is_none() {
            return Err(Error::NotFound { what: "job", id }.into());
        }
    }
    out.emit(&rows, || {
        if rows.is_empty() {
            return "no claims match".into();
        }
        let now = q.clock().now();
        let mut t =
            Table::new(&["SCOPE", "SOURCE", "ITEM", "STATUS", "JOB", "EXPIRES"]).right_align(&[4]);
        for c in &rows {
            t.row(vec![
                truncate(&c.identity.scope, 32),
                truncate(&c.identity.source_type, 16),
                truncate(&c.identity.item_id, 40),
                c.status.to_string(),
                c.job_id
                    .map(|j| j.to_string())
                    .unwrap_or_else(|| "-".into()),
                claim_expiry(c, now),
            ]);
        }
        let mut text = t.render();
        if rows.len() as i64 == a.limit {
            text.push_str(&format!(
                "(showing the first {}; there may be more: raise --limit)\n",
                rows.len()
            ));
        }
        text
    })
}
