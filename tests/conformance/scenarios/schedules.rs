//! Schedule scenarios: cron across DST, dead workers, concurrent schedulers, fixed delay.

use super::Recorder;
use crate::harness::TestDb;
use chrono::{Duration, TimeZone, Utc};
use dockhand::maintenance::{Maintenance, MaintenanceConfig, MaintenanceReport};
use dockhand::store::ClaimRequest;
use dockhand::Clock;
use dockhand::{ActionQuery, ActionStatus, Recurrence, ScheduleSpec};
use serde_json::json;
use std::sync::Arc;

pub async fn s_a1_cron_paris_nine_am_across_dst(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("report", rec.ok_handler())
        .build()
        .await
        .unwrap();
    rt.queue()
        .schedule(ScheduleSpec::new(
            "report",
            json!({}),
            Recurrence::cron("0 9 * * *", "Europe/Paris").unwrap(),
        ))
        .await
        .unwrap();
    // 09:00 Paris is 08:00 UTC on 28 March (CET) and 07:00 UTC on 29 and 30 March (CEST).
    let expected = [
        Utc.with_ymd_and_hms(2026, 3, 28, 8, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(2026, 3, 29, 7, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(2026, 3, 30, 7, 0, 0).unwrap(),
    ];
    for (i, at) in expected.iter().enumerate() {
        db.clock.set(*at - Duration::seconds(1));
        rt.drain(10).await.unwrap();
        assert_eq!(rec.runs().len(), i, "nothing fires one second before {at}");
        db.clock.set(*at);
        rt.drain(10).await.unwrap();
        assert_eq!(rec.runs().len(), i + 1, "fires at {at}");
        assert_eq!(rec.runs()[i].at, *at);
    }
}

pub async fn s_a7_dead_worker_does_not_stop_interval_series(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("tick", rec.ok_handler())
        .build()
        .await
        .unwrap();
    rt.queue()
        .schedule(ScheduleSpec::new(
            "tick",
            json!({}),
            Recurrence::every(Duration::minutes(1)).unwrap(),
        ))
        .await
        .unwrap();
    rt.run_maintenance_once().await.unwrap();
    // A worker claims the first occurrence and dies (never finishes, never heartbeats).
    let now = db.clock.now();
    let dead = db
        .store
        .claim(&ClaimRequest {
            owner: "dead-worker",
            limit: 10,
            now,
            lease_until: now + Duration::seconds(30),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    // The next occurrence is still produced and runs.
    db.clock.advance(Duration::minutes(1));
    rt.drain(10).await.unwrap();
    let runs = rec.runs();
    assert!(!runs.is_empty(), "the series goes on");
    // The dead worker's occurrence was reaped and ran too.
    let first = rt.queue().get(dead[0].id).await.unwrap();
    assert_eq!(first.status, ActionStatus::Complete);
    assert_eq!(first.attempt, 2);
    assert_eq!(runs.len(), 2);
}

pub async fn s_a7_two_schedulers_make_each_occurrence_once(db: TestDb) {
    let q = db.queue();
    q.schedule(ScheduleSpec::new(
        "tick",
        json!({}),
        Recurrence::every(Duration::seconds(1)).unwrap(),
    ))
    .await
    .unwrap();
    let other = db.open_another().await;
    let mk = |store| {
        Maintenance::new(
            store,
            Arc::new(db.clock.clone()),
            MaintenanceConfig::default(),
            "m".into(),
        )
    };
    let (m1, m2) = (mk(db.store.clone()), mk(other));
    let mut total = 0;
    for _ in 0..20 {
        let (mut r1, mut r2) = (MaintenanceReport::default(), MaintenanceReport::default());
        let (a, b) = tokio::join!(m1.schedule(&mut r1), m2.schedule(&mut r2));
        a.unwrap();
        b.unwrap();
        total += r1.materialised + r2.materialised;
        db.clock.advance(Duration::seconds(1));
    }
    let actions = q
        .query(&ActionQuery {
            limit: 1000,
            ..ActionQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(actions.len() as u64, total);
    let mut times: Vec<_> = actions.iter().map(|a| a.scheduled_at).collect();
    times.sort();
    let before = times.len();
    times.dedup();
    assert_eq!(times.len(), before, "no occurrence twice");
    // 20 ticks one second apart with a 5 s lookahead: occurrences 0..=24 s, each once.
    assert_eq!(before, 25);
    for w in times.windows(2) {
        assert_eq!(w[1] - w[0], Duration::seconds(1), "no occurrence lost");
    }
}

pub async fn store_fixed_delay_schedule_rearms_after_finish(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("poll", rec.ok_handler())
        .build()
        .await
        .unwrap();
    let id = rt
        .queue()
        .schedule(ScheduleSpec::new(
            "poll",
            json!({}),
            Recurrence::every_after_finish(Duration::minutes(5)).unwrap(),
        ))
        .await
        .unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(rec.runs().len(), 1);
    let finished_at = db.clock.now();
    // Re-armed from the finish time, not from the schedule's anchor.
    db.clock.advance(Duration::minutes(2));
    rt.drain(10).await.unwrap();
    let s = rt.queue().schedules().await.unwrap();
    let s = s.iter().find(|s| s.id == id).unwrap();
    assert_eq!(s.next_run_at, Some(finished_at + Duration::minutes(5)));
    assert_eq!(rec.runs().len(), 1);
    db.clock.set(finished_at + Duration::minutes(5));
    rt.drain(10).await.unwrap();
    assert_eq!(rec.runs().len(), 2);
}

pub async fn store_schedule_upsert_by_name_is_idempotent(db: TestDb) {
    let q = db.queue();
    let spec = || {
        ScheduleSpec::new(
            "h",
            json!({"a": 1}),
            Recurrence::every(Duration::minutes(1)).unwrap(),
        )
        .name("nightly")
    };
    let a = q.schedule(spec()).await.unwrap();
    db.clock.advance(Duration::seconds(10));
    let b = q.schedule(spec()).await.unwrap();
    assert_eq!(a, b);
    let all = q.schedules().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(
        all[0].next_run_at,
        Some(crate::harness::t0()),
        "unchanged recurrence keeps its next run"
    );
    // Changing the recurrence re-anchors it.
    q.schedule(
        ScheduleSpec::new(
            "h",
            json!({"a": 1}),
            Recurrence::cron("0 0 * * *", "UTC").unwrap(),
        )
        .name("nightly"),
    )
    .await
    .unwrap();
    let all = q.schedules().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(
        all[0].next_run_at,
        Some(Utc.with_ymd_and_hms(2026, 3, 28, 0, 0, 0).unwrap())
    );
    assert!(matches!(all[0].recurrence, Recurrence::Cron { .. }));
}
