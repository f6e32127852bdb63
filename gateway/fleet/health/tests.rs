//! The health rules on one worker and one ejection group, at instants the tests choose.

use super::*;

fn policy() -> Arc<HealthPolicy> {
    Arc::new(HealthPolicy {
        interval: Duration::from_secs(5),
        unhealthy_threshold: 2,
        healthy_threshold: 2,
        consecutive_failures: 3,
        base_ejection: Duration::from_secs(10),
        max_ejection: Duration::from_secs(35),
        max_ejected_share: 0.5,
    })
}

fn health(group: &Arc<EjectionGroup>) -> WorkerHealth {
    WorkerHealth::new(policy(), group.clone())
}

#[test]
fn failures_in_a_row_eject_and_a_success_between_resets_the_run() {
    let group = Arc::new(EjectionGroup::new(2, 0.5));
    let h = health(&group);
    let t = Instant::now();
    assert_eq!(h.failure(t, "status_5xx"), None);
    assert_eq!(h.failure(t, "status_5xx"), None);
    assert!(!h.success_at(t));
    assert_eq!(h.failure(t, "status_5xx"), None);
    assert_eq!(h.failure(t, "status_5xx"), None);
    let ejection = h
        .failure(t, "guard_trip")
        .expect("third failure in a row ejects");
    assert_eq!(ejection.duration, Duration::from_secs(10));
    assert_eq!(ejection.cause, "guard_trip");
    assert_eq!(group.ejected(), 1);
    assert_eq!(
        h.serving_at(t + Duration::from_secs(4)),
        Serving::Ejected {
            remaining: Duration::from_secs(6),
            cause: "guard_trip"
        }
    );
    assert_eq!(h.back_in(t), Some(Duration::from_secs(10)));
}

#[test]
fn a_failed_trial_ejects_again_for_twice_as_long_capped_and_a_passed_one_closes() {
    let group = Arc::new(EjectionGroup::new(2, 0.5));
    let h = health(&group);
    let mut t = Instant::now();
    for _ in 0..3 {
        h.failure(t, "upstream_unavailable");
    }
    let mut expected = [20, 35, 35].into_iter();
    for _ in 0..3 {
        t += h.back_in(t).unwrap();
        assert_eq!(h.serving_at(t), Serving::Trial);
        let again = h.failure(t, "upstream_unavailable").expect("trial failed");
        assert!(again.after_trial);
        assert_eq!(
            again.duration,
            Duration::from_secs(expected.next().unwrap())
        );
        assert_eq!(group.ejected(), 1, "a trial keeps its slot");
    }
    t += h.back_in(t).unwrap();
    assert!(
        !h.success_at(t - Duration::from_secs(1)),
        "sent before the trial"
    );
    assert!(h.success_at(t));
    assert_eq!(h.serving_at(t), Serving::Yes);
    assert_eq!(group.ejected(), 0);
    // The next run of failures soon after starts from the longer backoff...
    for _ in 0..3 {
        h.failure(t, "x");
    }
    assert_eq!(h.back_in(t), Some(Duration::from_secs(35)));
    // ...but a worker that stayed in service for max_ejection starts over.
    t += Duration::from_secs(35);
    assert!(h.success_at(t));
    t += Duration::from_secs(35);
    for _ in 0..3 {
        h.failure(t, "x");
    }
    assert_eq!(h.back_in(t), Some(Duration::from_secs(10)));
}

#[test]
fn the_share_caps_ejections_per_group() {
    let group = Arc::new(EjectionGroup::new(3, 0.5));
    let (a, b) = (health(&group), health(&group));
    let t = Instant::now();
    for _ in 0..3 {
        a.failure(t, "x");
        b.failure(t, "x");
    }
    assert!(matches!(a.serving_at(t), Serving::Ejected { .. }));
    assert_eq!(b.serving_at(t), Serving::Yes, "1 of 3 at share 0.5");
    let single = Arc::new(EjectionGroup::new(1, 0.5));
    let only = health(&single);
    for _ in 0..10 {
        assert_eq!(only.failure(t, "x"), None);
    }
    assert_eq!(only.serving_at(t), Serving::Yes);
}

#[test]
fn probes_take_a_worker_down_and_bring_it_back_only_after_recovery() {
    let h = health(&Arc::new(EjectionGroup::new(1, 0.0)));
    assert_eq!(h.probe(Err("refused".into())), ProbeVerdict::Steady);
    assert_eq!(h.probe(Err("refused".into())), ProbeVerdict::WentDown);
    assert_eq!(
        h.serving(),
        Serving::Down {
            error: "refused".into()
        }
    );
    assert_eq!(h.probe(Ok(())), ProbeVerdict::Steady);
    assert_eq!(h.probe(Ok(())), ProbeVerdict::Recovering);
    assert!(matches!(h.serving(), Serving::Down { .. }));
    h.mark_up();
    assert_eq!(h.serving(), Serving::Yes);
    assert_eq!(h.snapshot(Instant::now()).state, "serving");
}

#[test]
fn a_worker_that_recovers_from_down_is_on_trial_instead_of_waiting_out_its_ejection() {
    let h = health(&Arc::new(EjectionGroup::new(2, 0.5)));
    let t = Instant::now();
    for _ in 0..3 {
        h.failure(t, "upstream_unavailable");
    }
    h.probe(Err("refused".into()));
    h.probe(Err("refused".into()));
    h.probe(Ok(()));
    assert_eq!(h.probe(Ok(())), ProbeVerdict::Recovering);
    h.mark_up_at(t + Duration::from_secs(1));
    assert_eq!(h.serving_at(t + Duration::from_secs(1)), Serving::Trial);
    assert!(h.success_at(t + Duration::from_secs(1)));
    assert_eq!(h.serving_at(t + Duration::from_secs(1)), Serving::Yes);
}

#[test]
fn one_tenants_failures_never_eject_two_tenants_or_an_engine_failure_do() {
    let group = Arc::new(EjectionGroup::new(4, 1.0));
    let h = health(&group);
    let now = Instant::now();
    let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
    for _ in 0..10 {
        assert!(h.failure_by(now, "status_5xx", &a).is_none());
    }
    assert_eq!(h.serving_at(now), Serving::Yes);
    // A second tenant's failure in the same run: out.
    assert!(h.failure_by(now, "status_5xx", &b).is_some());
    // After the backoff, one tenant's failure does not end the trial.
    let later = now + Duration::from_secs(3600);
    assert!(h.failure_by(later, "status_5xx", &a).is_none());
    assert_eq!(h.serving_at(later), Serving::Trial);
    // A success ends the run: one tenant alone again cannot eject.
    let h = health(&group);
    h.failure_by(now, "status_5xx", &a);
    h.failure_by(now, "status_5xx", &b);
    assert!(!h.success_at(now));
    for _ in 0..5 {
        assert!(h.failure_by(now, "status_5xx", &a).is_none());
    }
    // A failure that counts alone (unreachable) makes the run count.
    assert!(h.failure(now, "upstream_unavailable").is_some());
}

#[test]
fn passive_ejection_off_never_ejects() {
    let mut p = (*policy()).clone();
    p.consecutive_failures = 0;
    let h = WorkerHealth::new(Arc::new(p), Arc::new(EjectionGroup::new(4, 1.0)));
    for _ in 0..100 {
        assert_eq!(h.failure(Instant::now(), "x"), None);
    }
}

#[test]
fn a_worker_carried_into_a_rebuilt_pool_keeps_its_ejection_in_the_new_group() {
    let old_group = Arc::new(EjectionGroup::new(2, 0.5));
    let old = health(&old_group);
    let t = Instant::now();
    for _ in 0..3 {
        old.failure(t, "status_5xx");
    }
    assert_eq!(old_group.ejected(), 1);
    // The pool is rebuilt with three workers: the engine stays out, counted in the new group.
    let new_group = Arc::new(EjectionGroup::new(3, 0.5));
    let new = health(&new_group);
    new.carry_from(&old);
    assert_eq!(new_group.ejected(), 1);
    assert_eq!(
        new.serving_at(t + Duration::from_secs(4)),
        Serving::Ejected {
            remaining: Duration::from_secs(6),
            cause: "status_5xx"
        }
    );
    // Its ejection ends in the new group.
    let later = t + Duration::from_secs(10);
    assert_eq!(new.serving_at(later), Serving::Trial);
    assert!(new.success_at(later));
    assert_eq!(new_group.ejected(), 0);
    // A healthy worker carries nothing out.
    let fresh_group = Arc::new(EjectionGroup::new(3, 0.5));
    let carried = health(&fresh_group);
    carried.carry_from(&health(&old_group));
    assert_eq!(fresh_group.ejected(), 0);
    assert_eq!(carried.serving_at(t), Serving::Yes);
}
