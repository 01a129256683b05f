//! Prometheus (issue 17 item 2): a runner drains a few actions with the recorder installed,
//! the database gauges are read once, and `/metrics` scraped over HTTP shows the counters,
//! histograms and gauges with their values. The recorder is global to this test binary: every
//! series asserted here carries labels unique to this run (hook and group names with a fresh
//! uuid), and the unlabelled gauges are checked on the store's snapshot, so the scenario's
//! three backends and the other scenarios running alongside do not disturb each other.

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, CompletionConfig};
use dockhand::jobs::{NewJob, StepAction};
use dockhand::prometheus::{self, GaugeRefresher};
use dockhand::{ActionSpec, Clock, HandlerError, Identity};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request to `addr`; the whole answer (head and body).
async fn http(addr: std::net::SocketAddr, request_line: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{request_line}\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The value of the sample `series` (name and labels exactly as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

pub async fn metrics_scrape_shows_a_drained_queue(db: TestDb) {
    let metrics = prometheus::install().expect("install the recorder");
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (ok, bad, group) = (
        format!("prom.ok.{tag}"),
        format!("prom.bad.{tag}"),
        format!("prom-{tag}"),
    );
    let t0 = db.clock.now();
    let rt = db
        .runtime()
        .handler(ok.clone(), |_| async { Ok::<(), HandlerError>(()) })
        .handler(bad.clone(), |_| async {
            Err::<(), _>(HandlerError::fatal("no"))
        })
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    // Five due a minute ago (lag 60 s on the frozen clock), one that fails, two due later.
    for i in 0..5 {
        q.enqueue(
            ActionSpec::new(ok.clone(), json!({ "i": i }))
                .group(group.clone())
                .at(t0 - Duration::minutes(1)),
        )
        .await
        .unwrap();
    }
    q.enqueue(
        ActionSpec::new(bad.clone(), json!({}))
            .group(group.clone())
            .max_attempts(1)
            .at(t0 - Duration::minutes(1)),
    )
    .await
    .unwrap();
    for i in 0..2 {
        q.enqueue(
            ActionSpec::new(ok.clone(), json!({ "later": i }))
                .group(group.clone())
                .at(t0 + Duration::hours(1)),
        )
        .await
        .unwrap();
    }
    assert_eq!(rt.run_due_once().await.unwrap(), 6);
    assert_eq!(rt.run_due_once().await.unwrap(), 0);
    // One more due 30 s ago, not run; a processing batch job holding one item claim.
    q.enqueue(
        ActionSpec::new(ok.clone(), json!({ "late": true }))
            .group(group.clone())
            .at(t0 - Duration::seconds(30)),
    )
    .await
    .unwrap();
    let job = db
        .store
        .create_job(
            &NewJob {
                pipeline: "p".into(),
                input_refs: vec![],
                engine_data: json!({}),
                step: StepAction {
                    priority: 0,
                    max_attempts: 3,
                    group: None,
                },
                idempotency_key: None,
            },
            t0,
        )
        .await
        .unwrap();
    let claimed = db
        .store
        .claim_item(
            &ClaimItemRequest {
                identity: Identity::new("s", "rss", "item-1").unwrap(),
                job_id: Some(job),
                ttl: Duration::minutes(10),
                completion: CompletionConfig::default(),
                reprocess: false,
                run: None,
            },
            t0,
        )
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Claimed(_)), "{claimed:?}");
    db.exec_sql(&format!(
        "UPDATE dockhand_jobs SET status = 'processing', batch_state = 'fenced' WHERE id = {job}"
    ))
    .await;

    let mut gauges = GaugeRefresher::new();
    let g = gauges
        .refresh(db.store.as_ref(), db.clock.now())
        .await
        .unwrap();
    let mine = g
        .groups
        .iter()
        .find(|r| r.group.as_deref() == Some(group.as_str()))
        .expect("the group's row");
    assert_eq!(
        (mine.pending, mine.due, mine.running, mine.failed),
        (3, 1, 0, 1)
    );
    assert_eq!(mine.oldest_due, Some(t0 - Duration::seconds(30)));
    assert_eq!(
        (g.jobs_processing, g.batches_open, g.claims_held),
        (1, 1, 1)
    );
    // The job's step action (ungrouped) is pending too.
    assert!(g.groups.iter().any(|r| r.group.is_none() && r.pending == 1));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(prometheus::serve(listener, metrics));
    let answer = http(addr, "GET /metrics HTTP/1.1").await;
    let (head, text) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains(prometheus::CONTENT_TYPE), "{head}");
    let v = |series: String| {
        sample(text, &series).unwrap_or_else(|| panic!("no `{series}` in:\n{text}"))
    };
    assert_eq!(
        v(format!("dockhand_actions_completed_total{{hook=\"{ok}\"}}")),
        5.0
    );
    assert_eq!(
        v(format!("dockhand_actions_failed_total{{hook=\"{bad}\"}}")),
        1.0
    );
    assert_eq!(
        v(format!("dockhand_actions_enqueued_total{{hook=\"{ok}\"}}")),
        8.0
    );
    assert_eq!(
        v(format!(
            "dockhand_run_duration_seconds_count{{hook=\"{ok}\"}}"
        )),
        5.0
    );
    // Lag: exactly 60 s each, so in the 60 s bucket and not the 30 s one.
    assert_eq!(
        v(format!(
            "dockhand_action_lag_seconds_bucket{{hook=\"{ok}\",le=\"30\"}}"
        )),
        0.0
    );
    assert_eq!(
        v(format!(
            "dockhand_action_lag_seconds_bucket{{hook=\"{ok}\",le=\"60\"}}"
        )),
        5.0
    );
    assert_eq!(
        v(format!("dockhand_action_lag_seconds_sum{{hook=\"{ok}\"}}")),
        300.0
    );
    for (status, n) in [("pending", 3.0), ("running", 0.0), ("failed", 1.0)] {
        assert_eq!(
            v(format!(
                "dockhand_actions{{group=\"{group}\",status=\"{status}\"}}"
            )),
            n,
            "{status}"
        );
    }
    assert_eq!(v(format!("dockhand_actions_due{{group=\"{group}\"}}")), 1.0);
    assert_eq!(
        v(format!(
            "dockhand_oldest_due_lag_seconds{{group=\"{group}\"}}"
        )),
        30.0
    );
    // Unlabelled series: present (their values are shared with the runs alongside).
    for name in [
        "dockhand_claim_duration_seconds_count{op=\"claim\"}",
        "dockhand_finish_duration_seconds_count",
        "dockhand_actions_claimed_total",
        "dockhand_jobs_processing",
        "dockhand_batches_open",
        "dockhand_item_claims_held",
    ] {
        assert!(v(name.to_string()) >= 0.0);
    }
    assert!(
        text.contains("# TYPE dockhand_run_duration_seconds histogram"),
        "{text}"
    );
    assert!(text.contains("# TYPE dockhand_actions gauge"), "{text}");

    // Other paths and methods.
    assert!(http(addr, "GET /other HTTP/1.1")
        .await
        .starts_with("HTTP/1.1 404"));
    let post = http(addr, "POST /metrics HTTP/1.1").await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    server.abort();
}
