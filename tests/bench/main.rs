//! Smoke tests of `deprov-lab bench delete`, `cascade-incident`, `deadline-incident` and `intake` at tiny sizes:
//! each runs the real procedure (PostgreSQL, PgBouncer 1.18, deprov in-process, pgbench) and checks
//! that the figures are produced and agree with each other and with the database, so the benches
//! cannot silently rot. They do not assert the goals: those are figures of a full-size run.

// Tests set up and inspect databases directly (clippy.toml's rules are the service's).
#![allow(clippy::disallowed_methods)]

use deprov_lab::bench::replay::cascade::{self, CascadeArgs};
use deprov_lab::bench::replay::deadline::{self, DeadlineArgs, ServicePer};
use deprov_lab::bench::replay::intake::{self, IntakeArgs};
use deprov_lab::bench::run::{self as delete, BenchArgs};

mod corpus;
mod target;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cascade_incident_figures_are_consistent() {
    let args = CascadeArgs {
        rows: 5_000,
        small_tenants: 3,
        retries: 3,
        retry_interval_ms: 10,
        fg_rate: 50,
        fg_max_conns: 20,
        pool_size: 4,
        max_client_conn: 100,
        baseline_secs: 1,
        recovery_timeout_secs: 30,
        json: true,
    };
    let r = cascade::run(&args).await.expect("bench runs");
    // deprov's job completed (run() fails otherwise) and the two databases are equal: both deleted.
    assert!(r.equals_cascade, "{r:#?}");
    assert!(r.baseline_p99_ms > 0.0 && r.slow_ms >= r.baseline_p99_ms + 10.0);
    for side in [&r.naive, &r.deprov] {
        assert_eq!(side.requests, 4, "{side:#?}");
        assert!(side.fg_ops > 0 && side.peaks.samples > 0, "{side:#?}");
        assert!(side.fg_errors >= side.fg_max_client_conn_errors);
        assert!(side.fg_p99_ms <= side.fg_max_ms);
        assert!(side.deletion_s > 0.0 && side.recovered);
        assert!(
            side.disturbed_s <= side.deletion_s + side.recovery_s + 1e-9,
            "{side:#?}"
        );
    }
    assert_eq!(r.naive.jobs, None);
    assert_eq!(r.naive.requests_failed, 0, "{:#?}", r.naive);
    assert_eq!(
        r.deprov.jobs,
        Some(1),
        "four requests for one tenant: one job"
    );
    assert_eq!(r.deprov.requests_failed, 0);
    let text = r.to_text();
    assert_eq!(
        text.matches("PASS  ").count() + text.matches("MISSED").count(),
        r.goals.len()
    );
    assert_eq!(r.goals.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadline_incident_figures_are_consistent() {
    let args = DeadlineArgs {
        pool_size: 2,
        service_ms: 10,
        base_rate: Some(50.0),
        burst_factor: 3.0,
        deadline_ms: 100,
        warmup_secs: 1,
        burst_secs: 1,
        after_secs: 1,
        client_conns: 4,
        service_per: ServicePer::Statement,
        json: true,
    };
    let r = deadline::run(&args).await.expect("bench runs");
    assert_eq!(r.service_per, ServicePer::Statement);
    assert!((r.burst_rate - 150.0).abs() < 1e-9);
    for side in [&r.deprov, &r.naive] {
        // 50 + 150 + 50 scheduled; every one ends one way.
        assert!((245..=255).contains(&side.sent), "{side:#?}");
        assert_eq!(side.ok + side.deadline_fired + side.errors, side.sent);
        assert!(side.ok > 0, "{side:#?}");
        // Every answered request waited for at least one service time on its server.
        assert!(side.p99_ms >= 10.0, "{side:#?}");
        assert!(
            side.usable_at_burst <= 2 && side.lowest_usable <= 2,
            "{side:#?}"
        );
        assert!(side.sessions >= 0);
    }
    let stored = r.deprov.recorded.expect("deprov counts its rows");
    assert!(
        stored >= r.deprov.ok as i64 && stored <= r.deprov.sent as i64,
        "every 202 is stored, nothing more than was sent: {stored} {:#?}",
        r.deprov
    );
    assert_eq!(r.naive.recorded, None);
    assert_eq!(r.goals.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn intake_figures_are_consistent() {
    let args = IntakeArgs {
        secs: 1,
        concurrency: 4,
        pgbench_clients: 2,
        rate: Some(20.0),
        latency_secs: 1,
        latency_rounds: 2,
        lock_waiters: 3,
        pool_size: 4,
        direct: false,
        group_writers: Some(3),
        server_settings: vec![("deadlock_timeout".into(), "2s".into())],
        json: true,
    };
    let r = intake::run(&args).await.expect("bench runs");
    assert_eq!(
        r.group_writers, 3,
        "--group-writers reaches the configuration"
    );
    assert!(r.accepted > 0, "{r:#?}");
    assert_eq!(r.accepted as i64, r.durable, "accepted == rows stored");
    assert!(r.intake_per_s > 0.0);
    assert!(r.pgbench.transactions > 0 && r.pgbench.tps > 0.0, "{r:#?}");
    assert_eq!(
        r.pgbench.rows, r.pgbench.transactions,
        "pgbench's count == rows inserted"
    );
    assert!(r.lock_waiters_seen >= 3, "the target was saturated: {r:#?}");
    // Two rounds of one second per condition at 20 requests/s.
    assert_eq!(r.latency_rounds, 2);
    for phase in [&r.baseline, &r.locked] {
        assert!((38..=42).contains(&phase.sent), "{phase:#?}");
        assert_eq!(phase.accepted + phase.errors, phase.sent);
        assert!(phase.p50_ms <= phase.p99_ms);
    }
    // ≤ 100 requests per condition: a p99 is the slowest, so the pooled p99 is the rounds' highest
    // and nothing in the idle segments is slower than it.
    assert_eq!(r.rounds_p99_ms.len(), 2, "{r:#?}");
    for (i, phase) in [&r.baseline, &r.locked].into_iter().enumerate() {
        let highest = r
            .rounds_p99_ms
            .iter()
            .map(|round| round[i])
            .fold(0.0, f64::max);
        assert_eq!(highest, phase.p99_ms, "{r:#?}");
        assert_eq!(
            r.slow_by_offset[i].len(),
            2,
            "half seconds of a 1 s segment"
        );
    }
    assert_eq!(r.slow_by_offset[0].iter().sum::<usize>(), 0, "{r:#?}");
    assert_eq!(r.goals.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_figures_are_consistent() {
    let args = BenchArgs {
        rows: 20_000,
        small_tenants: 3,
        batch_rows: 50,
        max_batch_ms: 100,
        checkpoint_interval_ms: 1000,
        // The figures compared are the batches'; this tenant may fit one transaction.
        no_whole_cascade: true,
        rate_limit: 0,
        duty_cycle: 1.0,
        paced_secs: 2,
        paced_segment_secs: 1,
        paced_duty_cycle: 0.01,
        clients: 2,
        rate: 50,
        baseline_secs: 1,
        shared_buffers: "128MB".into(),
        max_wal_size: "1GB".into(),
        server_settings: vec![],
        json: true,
        target: Default::default(),
    };
    let r = delete::run(&args).await.expect("bench runs");
    assert!(r.equals_cascade, "{r:#?}");
    assert_eq!(
        r.cascade.rows, r.deprov.rows,
        "both deleted the whole tenant"
    );
    assert!(r.cascade.rows >= 20_000, "{r:#?}");
    assert_eq!(r.cascade.transactions, 1);
    assert!(r.deprov.transactions > 1, "{r:#?}");
    assert!((r.ratio - r.deprov.rows_per_s / r.cascade.rows_per_s).abs() < 1e-9);
    // The unthrottled job never rested; the paced window did, for most of its time, and was
    // stopped before the end of the tenant.
    assert_eq!(r.deprov_time.pacing, 0.0, "{r:#?}");
    let paced = r.paced.as_ref().expect("a paced window");
    assert!(!paced.completed && paced.window_s == 2.0, "{paced:#?}");
    // Two 1 s segments of a worker, each after a 1 s segment with none.
    assert_eq!((paced.segments, paced.segment_s), (2, 1.0), "{paced:#?}");
    assert!(
        (2.0..3.5).contains(&paced.worker_s),
        "the worker ran for its window: {paced:#?}"
    );
    assert!(
        paced.side.elapsed_s >= paced.worker_s + 2.0 && paced.side.elapsed_s < 8.0,
        "the window's wall time holds both arms: {paced:#?}"
    );
    assert!(paced.side.rows < r.deprov.rows, "{paced:#?}");
    assert!(
        paced.worked_share > 0.0 && paced.worked_share < 0.5,
        "{paced:#?}"
    );
    // Both arms timed operations (2 clients at 50/s: about 100 a second each).
    assert!(
        paced.baseline_ops >= 100 && paced.side.foreground_ops >= 100,
        "{paced:#?}"
    );
    assert!(
        (paced.ratio() - paced.side.foreground_p99_ms / paced.baseline_p99_ms).abs() < 1e-9,
        "{paced:#?}"
    );
    // Each arm's p99 is at most its slowest segment's and at least its fastest's.
    for (arm, each) in [
        (paced.baseline_p99_ms, &paced.idle_segments_p99_ms),
        (paced.side.foreground_p99_ms, &paced.worker_segments_p99_ms),
    ] {
        assert_eq!(each.len(), 2, "{paced:#?}");
        let (lo, hi) = each
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(lo <= arm && arm <= hi, "{paced:#?}");
    }
    for side in [&r.cascade, &r.deprov, &paced.side] {
        assert!(side.foreground_ops > 0, "{side:#?}");
        assert!(
            side.foreground_p50_ms <= side.foreground_p99_ms,
            "{side:#?}"
        );
    }
    assert!(r.foreground_baseline_ops > 0);
    let text = r.to_text();
    assert_eq!(text.matches("(target").count(), 4, "{text}");
    assert!(text.contains("paced 0.01"), "{text}");
    assert!(text.contains("ran 2 segments of 1 s"), "{text}");
}
