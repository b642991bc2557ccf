//! `[sources.NAME] timestamp` + `max_age` on a scheme that signs no timestamp (here
//! `vercel-webhook`, whose envelope carries `createdAt` in Unix milliseconds): a fresh delivery is
//! recorded; the same delivery replayed past `max_age`, or one without the timestamp, is refused
//! 401 and stores nothing; the keys are refused where they prove nothing.

use deprov::sources::{unix_now, vercel};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, TestOptions, spawn_app_with};
use crate::signed::{Delivery, VERCEL_SECRET, answer};

async fn spawn(dir: &tempfile::TempDir) -> TestApp {
    let path = dir.path().join("vercel");
    std::fs::write(&path, format!("{VERCEL_SECRET}\n")).unwrap();
    let extra = format!(
        r#"
[sources.vercel-hooks]
scheme = "vercel-webhook"
secret_file = [{path:?}]
tenant = {{ pointer = "/payload/configuration/id" }}
delete_events = ["integration-configuration.removed"]
timestamp = "/createdAt"
max_age = "5m"
"#,
        path = path.display().to_string()
    );
    spawn_app_with(TestOptions {
        key_type: "text",
        extra_config: extra,
        ..Default::default()
    })
    .await
}

/// The removal of installation `id`, created at `created_ms` (absent: no `createdAt`), signed.
fn removal(id: &str, delivery: &str, created_ms: Option<i64>) -> Delivery {
    let mut body = json!({
        "id": delivery,
        "type": "integration-configuration.removed",
        "payload": {"configuration": {"id": id}, "team": {"id": "team_1"}}
    });
    if let Some(ms) = created_ms {
        body["createdAt"] = json!(ms);
    }
    let body = body.to_string().into_bytes();
    Delivery {
        source: "vercel-hooks",
        headers: vec![(
            "x-vercel-signature",
            vercel::sign(VERCEL_SECRET.as_bytes(), &body),
        )],
        body,
    }
}

#[tokio::test]
async fn a_fresh_delivery_is_recorded_and_a_stale_or_undated_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn(&dir).await;
    let now_ms = unix_now() * 1000;

    // A delivery captured 10 minutes ago, never seen: refused, nothing stored.
    let stale = app
        .deliver(&removal("icfg_old", "d-old", Some(now_ms - 600_000)))
        .await;
    let body = answer(stale, StatusCode::UNAUTHORIZED).await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("older than max_age (300 s)"),
        "{body}"
    );
    let undated = app.deliver(&removal("icfg_old", "d-none", None)).await;
    let body = answer(undated, StatusCode::UNAUTHORIZED).await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("no timestamp at \"/createdAt\""),
        "{body}"
    );
    let ahead = app
        .deliver(&removal("icfg_old", "d-ahead", Some(now_ms + 600_000)))
        .await;
    answer(ahead, StatusCode::UNAUTHORIZED).await;
    app.assert_nothing_stored().await;

    // Sent a minute ago: recorded, one job.
    let fresh = app
        .deliver(&removal("icfg_new", "d-new", Some(now_ms - 60_000)))
        .await;
    let body = answer(fresh, StatusCode::ACCEPTED).await;
    assert_eq!(body["duplicate"], json!(false), "{body}");
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}
