//! The chaos run's summary: one JSON document and one markdown table per run (RELIABILITY.md
//! §4), written to the run's output directory and printed.

use super::faults::FaultLog;
use super::verify::Verdict;
use serde::Serialize;
use std::collections::BTreeMap;

/// Everything a run reports.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// `passed`, `failed` or `not exercised`.
    pub result: String,
    /// Backend.
    pub backend: String,
    /// Profile.
    pub profile: String,
    /// Seed.
    pub seed: u64,
    /// The commit (from `DOCKHAND_COMMIT` or `git rev-parse HEAD`), if known.
    pub commit: Option<String>,
    /// Wall time of the whole run, seconds.
    pub duration_s: f64,
    /// Fault phase, seconds.
    pub fault_phase_s: f64,
    /// Drain time after the faults stopped, seconds.
    pub drain_s: f64,
    /// Faults applied by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Fault kinds that were expected but did not fire.
    pub not_exercised: Vec<&'static str>,
    /// Faults that could not be applied.
    pub faults_not_applied: Vec<String>,
    /// Late finishes fenced out (`lease lost`) plus stale claim completions rejected.
    pub stale_completions_rejected: u64,
    /// Clock offsets the skewed worker measured (ms; should be about minus its skew).
    pub skewed_worker_offsets_ms: Vec<i64>,
    /// Time from a SIGKILL until the killed worker's running actions had all moved on: p50
    /// and max, ms (kills that held nothing are not counted).
    pub recover_p50_ms: Option<u64>,
    /// See `recover_p50_ms`.
    pub recover_max_ms: Option<u64>,
    /// Kills followed.
    pub recover_samples: usize,
    /// The checker's verdict.
    pub verdict: Verdict,
}

/// `n start(s): min … max ms`.
fn offsets(v: &[i64]) -> String {
    match (v.iter().min(), v.iter().max()) {
        (Some(lo), Some(hi)) => format!("{} start(s): {lo} … {hi} ms", v.len()),
        _ => "none measured".into(),
    }
}

impl Summary {
    /// Fills the recovery figures from the fault log.
    pub fn recovery(&mut self, log: &FaultLog) {
        let mut v = log.recover_ms.clone();
        v.sort_unstable();
        self.recover_samples = v.len();
        self.recover_p50_ms = v.get(v.len() / 2).copied();
        self.recover_max_ms = v.last().copied();
    }

    /// The markdown form.
    pub fn markdown(&self) -> String {
        let c = &self.verdict.counts;
        let faults = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let ms = |v: Option<u64>| v.map_or("-".to_string(), |x| format!("{x} ms"));
        let mut s = format!(
            "### chaos {} / {} / seed {}: **{}**\n\n\
             | figure | value |\n| --- | --- |\n\
             | commit | {} |\n| duration (fault phase, drain) | {:.0} s ({:.0} s, {:.1} s) |\n\
             | actions enqueued / completed / failed by design | {} / {} / {} |\n\
             | extra attempts caused by faults | {} |\n\
             | jobs started / batches finished / batch children | {} / {} / {} |\n\
             | items processed / ledger rows | {} / {} |\n\
             | faults applied | {} |\n\
             | lost / duplicates | {} / {} |\n\
             | recovered (acknowledgement lost, found stored) | {} |\n\
             | stale completions rejected | {} |\n\
             | skewed worker's measured offsets (skew +30000 ms) | {} |\n\
             | time to recover after a kill: p50 / max (n) | {} / {} ({}) |\n",
            self.backend,
            self.profile,
            self.seed,
            self.result,
            self.commit.as_deref().unwrap_or("unknown"),
            self.duration_s,
            self.fault_phase_s,
            self.drain_s,
            c.actions_enqueued,
            c.actions_completed,
            c.actions_failed_by_design,
            c.extra_attempts,
            c.jobs_started,
            c.batches_finished,
            c.batch_children,
            c.items_processed,
            c.ledger_rows,
            faults,
            self.verdict.lost,
            self.verdict.duplicates,
            c.recovered_unknown,
            self.stale_completions_rejected,
            offsets(&self.skewed_worker_offsets_ms),
            ms(self.recover_p50_ms),
            ms(self.recover_max_ms),
            self.recover_samples,
        );
        if !self.not_exercised.is_empty() {
            s.push_str(&format!(
                "\nNot exercised: {}\n",
                self.not_exercised.join(", ")
            ));
        }
        if !self.faults_not_applied.is_empty() {
            s.push_str(&format!(
                "\nNot applied: {}\n",
                self.faults_not_applied.join("; ")
            ));
        }
        if !self.verdict.violations.is_empty() {
            s.push_str("\nViolations:\n");
            for v in self.verdict.violations.iter().take(50) {
                s.push_str(&format!("- {v}\n"));
            }
            if self.verdict.violations.len() > 50 {
                s.push_str(&format!(
                    "- … {} more\n",
                    self.verdict.violations.len() - 50
                ));
            }
        }
        s
    }
}
