//! Jobs and batches: the job list's filters and pages, a job's page (steps, actions, claims),
//! fail and cancel through the terminal bridge, batch progress, failed children and cancel.

use crate::seed::{batch, claim, finish_job, job};
use crate::support::{get, link, row_ids, Fixture, Session};
use axum::http::StatusCode;
use chrono::Duration;
use dockhand::claims::ClaimFilter;
use dockhand::ui::{Access, UiConfig};
use dockhand::JobStatus;

async fn job_status(f: &Fixture, id: i64) -> JobStatus {
    f.store
        .get_job(id)
        .await
        .expect("get job")
        .expect("job")
        .status
}

async fn held_claims(f: &Fixture, job: i64) -> usize {
    f.store
        .list_claims(&ClaimFilter {
            job_id: Some(job),
            limit: 100,
            ..ClaimFilter::default()
        })
        .await
        .expect("claims")
        .len()
}

#[tokio::test]
async fn the_job_list_filters_and_pages() {
    let f = Fixture::new().await;
    let mut ingest = Vec::new();
    for _ in 0..5 {
        ingest.push(job(&f, "ingest").await);
    }
    let export = job(&f, "export").await;
    finish_job(&f, export, JobStatus::Completed, "done").await;
    finish_job(&f, ingest[1], JobStatus::Failed, "broke").await;
    let b = batch(&f).await;
    let app = f.app(UiConfig {
        page_size: 2,
        ..f.config(Access::ReadOnly)
    });
    let walk = |start: String| {
        let app = app.clone();
        async move {
            let (mut ids, mut path, mut last) = (Vec::new(), Some(start), String::new());
            while let Some(p) = path {
                let a = get(&app, &p, &[]).await;
                assert_eq!(a.status, StatusCode::OK, "{p}: {}", a.text());
                let html = a.text();
                ids.extend(row_ids(&html, "/jobs/"));
                path = link(&html, "next");
                last = p;
            }
            (ids, last)
        }
    };
    let newest_first = |mut v: Vec<i64>| {
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    };
    let (ids, last) = walk("/jobs?pipeline=ingest".into()).await;
    assert_eq!(ids, newest_first(ingest.clone()));
    assert!(last.contains("pipeline=ingest"), "{last}");
    // Back from the last page.
    let (mut back, mut path) = (Vec::new(), Some(last));
    while let Some(p) = path {
        let html = get(&app, &p, &[]).await.text();
        let mut page = row_ids(&html, "/jobs/");
        page.extend(back);
        back = page;
        path = link(&html, "prev");
    }
    assert_eq!(back, ids);
    let (ids, _) = walk("/jobs?status=completed".into()).await;
    assert_eq!(ids, newest_first(vec![export, b.children[0]]));
    let (ids, _) = walk("/jobs?status=failed".into()).await;
    assert_eq!(ids, newest_first(vec![ingest[1], b.children[1]]));
    let (ids, _) = walk(format!("/jobs?parent={}", b.parent)).await;
    assert_eq!(ids, newest_first(b.children.clone()));
    let (ids, _) = walk("/jobs".into()).await;
    assert_eq!(ids.len(), 5 + 1 + 1 + 3);
    for (query, field) in [("status=nope", "status"), ("parent=x", "parent")] {
        let a = get(&app, &format!("/jobs?{query}"), &[]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}");
        assert!(a.text().contains(field), "{query}: {}", a.text());
    }
}

#[tokio::test]
async fn a_job_page_shows_steps_actions_and_claims_and_fail_goes_through_the_bridge() {
    let f = Fixture::new().await;
    let id = job(&f, "ingest").await;
    let other = job(&f, "ingest").await;
    claim(&f, "feed-a", "item-1", id, Duration::minutes(10)).await;
    claim(&f, "feed-a", "item-2", id, Duration::minutes(10)).await;
    claim(&f, "feed-a", "item-3", other, Duration::minutes(10)).await;
    let app = f.app(f.config(Access::Operator));
    let page = format!("/jobs/{id}");
    let html = get(&app, &page, &[]).await.text();
    assert!(
        html.contains(&format!(
            "<h1>Job {id} <span class=\"badge s-pending\">pending</span></h1>"
        )),
        "{html}"
    );
    assert!(html.contains("<code>ingest</code>"), "{html}");
    assert!(
        html.contains(
            r#"<ol class="stepper"><li class="current"><span class="n">0</span> step 0</li></ol>"#
        ),
        "{html}"
    );
    // Its first step action, by its key.
    let step = f.store.job_actions(id, 10).await.expect("job actions");
    assert_eq!(step.len(), 1);
    assert!(
        html.contains(&format!(
            r#"<a href="/actions/{}">{}</a>"#,
            step[0].id, step[0].id
        )),
        "{html}"
    );
    assert!(html.contains(&format!("<code>j:{id}:0</code>")), "{html}");
    // Its claims, not the other job's.
    assert!(html.contains("Item claims (2)"), "{html}");
    assert!(html.contains("item-1") && html.contains("item-2") && !html.contains("item-3"));
    assert!(
        html.contains(&format!(r#"action="/jobs/{id}/fail""#)),
        "{html}"
    );
    assert!(
        html.contains(&format!(r#"action="/jobs/{id}/cancel""#)),
        "{html}"
    );

    let s = Session::open(&app, &page, &[]).await;
    let a = s.post(&app, &format!("{page}/fail"), &[]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(a.header("location"), format!("{page}?msg=job-failed"));
    assert_eq!(job_status(&f, id).await, JobStatus::Failed);
    let reason = f.store.get_job(id).await.expect("get").expect("job").reason;
    assert_eq!(reason.as_deref(), Some("operator ui:anonymous"));
    assert_eq!(held_claims(&f, id).await, 0, "its claims were given back");
    assert_eq!(held_claims(&f, other).await, 1);
    assert_eq!(job_status(&f, other).await, JobStatus::Pending);
    let html = get(&app, a.header("location"), &[]).await.text();
    assert!(
        html.contains("Job failed through the terminal bridge"),
        "{html}"
    );
    assert!(html.contains("badge s-failed"), "{html}");
    assert!(
        !html.contains(&format!("/jobs/{id}/fail")),
        "a final job has no buttons"
    );
    assert!(!html.contains(&format!("/jobs/{id}/cancel")));

    // Cancel after fail: nothing changes, and the page says so.
    let a = s.post(&app, &format!("{page}/cancel"), &[]).await;
    assert_eq!(a.header("location"), format!("{page}?msg=job-final"));
    assert_eq!(job_status(&f, id).await, JobStatus::Failed);
    let html = get(&app, a.header("location"), &[]).await.text();
    assert!(
        html.contains("Nothing changed: the job was already final."),
        "{html}"
    );

    // Cancel with htmx: the job's new page as a fragment.
    let a = s
        .post(
            &app,
            &format!("/jobs/{other}/cancel"),
            &[("hx-request", "true")],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let html = a.text();
    assert!(html.starts_with(&format!("<h1>Job {other} ")), "{html}");
    assert!(
        html.contains("Job cancelled through the terminal bridge"),
        "{html}"
    );
    assert_eq!(job_status(&f, other).await, JobStatus::Cancelled);
    assert_eq!(held_claims(&f, other).await, 0);

    assert_eq!(
        get(&app, "/jobs/999999", &[]).await.status,
        StatusCode::NOT_FOUND
    );
    let a = s.post(&app, "/jobs/999999/fail", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn batches_show_progress_and_failed_children_and_cancel_stops_scheduling() {
    let f = Fixture::new().await;
    let plain = job(&f, "ingest").await;
    let b = batch(&f).await;
    let app = f.app(f.config(Access::Operator));
    let html = get(&app, "/batches", &[]).await.text();
    assert_eq!(row_ids(&html, "/batches/"), vec![b.parent], "{html}");
    assert!(
        html.contains(r#"<progress max="5" value="2">2/5</progress>"#),
        "{html}"
    );
    assert!(
        html.contains(r#"<span class="muted">2 / 5</span>"#),
        "{html}"
    );

    let page = format!("/batches/{}", b.parent);
    let html = get(&app, &page, &[]).await.text();
    for want in [
        "<dt>children</dt><dd>3 created, 2 finished</dd>",
        "<dt>completed</dt><dd>1</dd>",
        "<dt>failed</dt><dd>1</dd>",
        "<dt>worklist</dt><dd>2 ready, 0 leased, 3 done, 0 discarded</dd>",
        "<dt>items</dt><dd>5 in chunks of 2 (child step 1)</dd>",
        "<dt>fenced</dt><dd>no: chunks still scheduling</dd>",
    ] {
        assert!(html.contains(want), "{want}: {html}");
    }
    // Failed children: the failed one only.
    let failed_part = &html[html.find("Failed children").expect("section")..];
    assert_eq!(row_ids(failed_part, "/jobs/"), vec![b.children[1]]);
    assert!(failed_part.contains("child broke"));
    assert!(
        failed_part.contains("starts a new batch that claims their items again"),
        "how to run failed items again: {failed_part}"
    );
    assert!(html.contains(&format!(r#"action="/batches/{}/cancel""#, b.parent)));
    // The parent's job page links its batch and says what cancel does.
    let html = get(&app, &format!("/jobs/{}", b.parent), &[]).await.text();
    assert!(
        html.contains(&format!(
            r#"<a href="/batches/{}">batch progress</a>"#,
            b.parent
        )),
        "{html}"
    );
    assert!(
        html.contains("Cancel job and its remaining children"),
        "{html}"
    );
    // A job that did not fan out has no batch page.
    let a = get(&app, &format!("/batches/{plain}"), &[]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().contains("did not fan out"), "{}", a.text());

    let s = Session::open(&app, &page, &[]).await;
    let a = s.post(&app, &format!("{page}/cancel"), &[]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(a.header("location"), format!("{page}?msg=batch-canceled"));
    let st = f
        .store
        .batch_state(b.parent)
        .await
        .expect("state")
        .expect("batch");
    assert_eq!(st.outcome.as_deref(), Some("cancel_requested"));
    assert!(st.fenced);
    // B5: the child not yet started is cancelled through the bridge; the completed and the
    // failed one stand. No child is active, so the parent is cancelled at once (its worklist,
    // unscheduled items discarded, is cleaned up with it).
    assert_eq!(job_status(&f, b.children[2]).await, JobStatus::Cancelled);
    assert_eq!(job_status(&f, b.children[0]).await, JobStatus::Completed);
    assert_eq!(job_status(&f, b.parent).await, JobStatus::Cancelled);
    assert_eq!((st.ready, st.leased), (0, 0), "nothing left to schedule");
    let html = get(&app, a.header("location"), &[]).await.text();
    assert!(
        html.contains("<dt>outcome</dt><dd>cancel_requested</dd>"),
        "{html}"
    );
    assert_eq!(
        s.post(&app, "/batches/999999/cancel", &[]).await.status,
        StatusCode::NOT_FOUND
    );
}
