//! Packet refs and worklist payloads (§5 row 5): random refs and bodies never panic the
//! hydration code and are accepted only when exact; a worklist row whose payload ref or claim
//! sidecar is replaced by random text takes the discard path in a real batch — its claim
//! released (by job id when the sidecar is malformed), the other rows turned into children,
//! the parent final, `check` clean.

use crate::args::json;
use crate::harness::{Kind, TestDb};
use crate::support::{check, tokio_rt};
use dockhand::claims::CompletionConfig;
use dockhand::jobs::packets::{encode, parse_ref, verify};
use dockhand::{HandlerError, Identity, JobStatus, Packet, Pipeline, StepOutput};
use proptest::prelude::*;
use serde_json::json;

/// Strings near the ref format: right/wrong version, hex of every length and case, junk.
fn reference() -> impl Strategy<Value = String> {
    prop_oneof![
        "v1:[0-9a-f]{64}",
        "v[0-9]:[0-9a-fA-F]{60,68}",
        "[a-z0-9:]{0,80}",
        any::<String>(),
    ]
}

#[test]
fn refs_are_accepted_only_when_exact() {
    check(4096, reference(), |r| {
        let exact = r.len() == 67
            && r.starts_with("v1:")
            && r[3..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        match parse_ref(&r) {
            Ok(hash) => {
                prop_assert!(exact, "accepted `{r}`");
                prop_assert_eq!(hash, &r[3..]);
            }
            Err(e) => {
                prop_assert!(!exact, "refused the exact ref `{r}`: {e}");
                prop_assert!(
                    e.to_string().contains("packet ref"),
                    "error names the input: {e}"
                );
            }
        }
        Ok(())
    });
}

#[test]
fn bodies_verify_only_against_their_own_ref() {
    let body = prop_oneof![
        json().prop_map(|v| Some(serde_json::to_string(&v).unwrap_or_default())),
        any::<String>().prop_map(Some),
        Just(None),
    ];
    check(
        2048,
        (json(), body, reference()),
        |(value, body, junk_ref)| {
            // Every value round-trips through its own encoding.
            if let Ok(p) = encode(&value) {
                let back = verify(&p.reference, Some(p.body.clone()));
                prop_assert!(back.is_ok(), "own body refused: {back:?}");
                // Any other body is refused unless it is byte-identical.
                if let Some(other) = &body {
                    if *other != p.body {
                        prop_assert!(verify(&p.reference, Some(other.clone())).is_err());
                    }
                }
                prop_assert!(verify(&p.reference, None).is_err(), "missing body accepted");
            }
            // Random refs with random bodies never panic; acceptance needs the hash to match.
            if verify(&junk_ref, body.clone()).is_ok() {
                prop_assert!(
                    parse_ref(&junk_ref).is_ok() && body.is_some(),
                    "accepted `{junk_ref}`"
                );
            }
            Ok(())
        },
    );
}

/// What replaces row 1 of a 3-row worklist.
#[derive(Debug, Clone)]
enum Corruption {
    PayloadRef(String),
    Sidecar(String),
}

/// Sidecars are JSON of the wrong shape on every backend, and also arbitrary text where the
/// column is text (PostgreSQL's is `jsonb`, which refuses non-JSON itself).
fn corruption(kind: Kind) -> BoxedStrategy<Corruption> {
    let wrong_shape = prop_oneof![
        json().prop_map(|v| serde_json::to_string(&v).unwrap_or_default()),
        Just("[{\"identity\":1}]".to_string()),
    ];
    let sidecar = match kind {
        Kind::Postgres => wrong_shape.boxed(),
        _ => prop_oneof![wrong_shape, "[\\[\\]{}\":,a-z0-9 ]{0,40}", any::<String>()].boxed(),
    };
    prop_oneof![
        reference().prop_map(Corruption::PayloadRef),
        sidecar.prop_map(Corruption::Sidecar),
    ]
    .boxed()
}

/// `retain_processed = true`: a claim the parent's success completed would stay as a
/// processed row, so a discarded row whose claim was not released shows (with `false` the
/// completed claim is deleted and looks released).
fn plain() -> CompletionConfig {
    CompletionConfig {
        handler: None,
        payload: serde_json::Value::Null,
        retain_processed: true,
    }
}

/// `s` as the inside of a SQL string literal on `kind`: single quotes doubled, backslashes
/// doubled on MySQL (an escape character there), NUL (refused by PostgreSQL) replaced.
fn sql_text(kind: Kind, s: &str) -> String {
    let s = s.replace('\0', " ").replace('\'', "''");
    match kind {
        Kind::Mysql => s.replace('\\', "\\\\"),
        _ => s,
    }
}

fn corrupt_rows_are_discarded(kind: Kind) {
    let rt = tokio_rt();
    let Some(db) = rt.block_on(TestDb::new(kind)) else {
        return;
    };
    let case = std::sync::atomic::AtomicUsize::new(0);
    check(24, corruption(kind), |c| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        rt.block_on(async {
            let scope = format!("shared:h{n}");
            let s2 = scope.clone();
            let runtime = db
                .runtime()
                .pipeline(
                    Pipeline::new("hyd")
                        .step("split", move |ctx| {
                            let scope = s2.clone();
                            async move {
                                let mut out = Vec::new();
                                for i in 0..3 {
                                    let d = ctx
                                        .claim_in(&scope, "src", &format!("i{i}"), plain())
                                        .await
                                        .map_err(HandlerError::retry)?
                                        .ok_or_else(|| HandlerError::fatal("held"))?;
                                    out.push(Packet::new(json!({"i": i})).with_claim(d));
                                }
                                Ok(StepOutput::Packets(out))
                            }
                        })
                        .step("child", |_ctx| async { Ok(StepOutput::one(json!({}))) })
                        .chunk_size(10),
                )
                .build()
                .await
                .unwrap();
            let parent = runtime.jobs().start("hyd", json!({})).await.unwrap();
            runtime.run_due_once().await.unwrap(); // split: worklist rows 0..3
            let set = match &c {
                Corruption::PayloadRef(r) => format!("payload_ref = '{}'", sql_text(kind, r)),
                Corruption::Sidecar(s) => format!("sidecar = '{}'", sql_text(kind, s)),
            };
            db.exec_sql(&format!(
                "UPDATE dockhand_worklist SET {set} WHERE parent_id = {parent} AND idx = 1"
            ))
            .await;
            runtime.drain(1000).await.unwrap();
            let job = runtime.jobs().get(parent).await.unwrap();
            prop_assert!(job.status.is_final(), "parent {parent} left {}", job.status);
            prop_assert_eq!(job.status, JobStatus::Completed);
            let st = runtime.jobs().batch_state(parent).await.unwrap().unwrap();
            // An intact-looking replacement (e.g. the same ref) may still hydrate: then all
            // three are children; otherwise row 1 is discarded and its claim released.
            let claim = runtime
                .jobs()
                .claim_state(&Identity::new(scope.as_str(), "src", "i1").unwrap())
                .await
                .unwrap();
            if st.children_total == 2 {
                prop_assert!(claim.is_none(), "discarded row's claim released: {claim:?}");
            } else {
                prop_assert_eq!(st.children_total, 3);
            }
            let v = runtime.jobs().check().await.unwrap();
            prop_assert!(v.is_empty(), "check: {v:?}");
            Ok(())
        })
    });
    rt.block_on(db.cleanup());
}

crate::per_backend!(corrupt_rows_are_discarded);
