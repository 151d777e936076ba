//! Unit tests of [`super`]: the cadences of searches again, and the budget's boost.

use super::*;

#[test]
fn the_safety_net_costs_a_thousandth_of_the_search_at_least_a_minute_apart() {
    let ms = Duration::from_millis;
    // A small process searched in 5 ms: every minute.
    assert_eq!(again_after(ms(5), RESEARCH_MIN), REPROVE_AFTER);
    // A 1.5 GiB daemon searched in 0.2 s: every 200 s, not every minute.
    assert_eq!(again_after(ms(200), ms(20_000)), Duration::from_secs(200));
    // A search of 10 s: at most RESEARCH_MAX apart.
    assert_eq!(again_after(ms(10_000), RESEARCH_MAX), RESEARCH_MAX);
    // Never sooner than the cadence.
    assert_eq!(
        again_after(ms(1), Duration::from_secs(90)),
        Duration::from_secs(90)
    );
}

#[test]
fn a_cut_search_is_tried_again_once_with_twice_the_budget() {
    let opts = ProveOptions::default();
    let budget = opts.budget.unwrap();
    let cut = ProofSample {
        unsearched: Some(Unsearched::partly_over_budget()),
        ..ProofSample::default()
    };
    assert!(by_budget(&cut));
    assert!(by_budget(&ProofSample {
        unsearched: Some(Unsearched::over_budget(2.0)),
        ..ProofSample::default()
    }));
    // Whole, or short for another reason: not the budget's.
    assert!(!by_budget(&ProofSample::default()));
    let gone = ProofSample {
        unsearched: Some(Unsearched::from_error(
            crate::sample::unsearched::EXITED.into(),
        )),
        ..ProofSample::default()
    };
    assert!(!by_budget(&gone));
    let with = |cuts: &[u32]| boosted(opts, cuts.iter().copied()).budget;
    assert_eq!(with(&[]), Some(budget));
    assert_eq!(with(&[0, 1]), Some(budget * 2));
    // Never more than twice: a collection stays within twice its budget.
    assert_eq!(with(&[2]), Some(budget * 2));
    assert_eq!(with(&[3, 9]), Some(budget * 2));
    let unlimited = ProveOptions {
        budget: None,
        ..opts
    };
    assert_eq!(boosted(unlimited, [2].into_iter()).budget, None);
}
