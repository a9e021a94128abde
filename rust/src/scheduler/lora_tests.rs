//! LoRA scenarios (docs/scheduling.md §4.14): the `max_loras` skip in the
//! waiting pass and adapters keying the prefix cache.

use super::tests::{new_request, sampled, scheduler, Setup};
use super::Scheduler;
use crate::error::Error;
use crate::lora::LoraAdapter;

fn with_loras(max_loras: usize) -> Scheduler {
    scheduler(Setup {
        max_loras: Some(max_loras),
        ..Setup::default()
    })
}

fn add_with(s: &mut Scheduler, id: &str, prompt: Vec<u32>, lora: Option<u32>) {
    let mut r = new_request(id, prompt, 40);
    r.lora = lora.map(|id| LoraAdapter {
        id,
        name: format!("adapter-{id}"),
        path: format!("/adapters/{id}"),
    });
    s.add_request(r).unwrap();
}

/// Schedule and apply one step; the ids it scheduled, in order, and their
/// computed tokens before the step.
fn step(s: &mut Scheduler) -> Vec<(String, usize)> {
    let out = s.schedule();
    let ids = out
        .entries
        .iter()
        .map(|e| {
            let id = s.request(e.slot).unwrap().request_id.clone();
            (id, e.num_computed_tokens)
        })
        .collect();
    let (tokens, offsets) = sampled(s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    ids
}

fn ids(rows: &[(String, usize)]) -> Vec<&str> {
    rows.iter().map(|(id, _)| id.as_str()).collect()
}

#[test]
fn a_new_adapter_past_max_loras_is_skipped_and_keeps_its_place() {
    let mut s = with_loras(1);
    add_with(&mut s, "a", (10..20).collect(), Some(1));
    assert_eq!(ids(&step(&mut s)), ["a"]);
    // `b` would bring a second adapter: skipped. `c` shares `a`'s and `d`
    // has none: admitted behind it.
    add_with(&mut s, "b", (20..30).collect(), Some(2));
    add_with(&mut s, "c", (30..40).collect(), Some(1));
    add_with(&mut s, "d", (40..50).collect(), None);
    assert_eq!(ids(&step(&mut s)), ["a", "c", "d"]);
    assert_eq!(s.request_counts(), (3, 1));
    // Once no running request holds adapter 1, `b` goes first of the waiting.
    s.finish_requests(&["a", "c"], crate::RequestStatus::FinishedAborted);
    add_with(&mut s, "e", (50..60).collect(), Some(3));
    assert_eq!(ids(&step(&mut s)), ["d", "b"]);
    assert_eq!(
        s.request_counts(),
        (2, 1),
        "e waits: adapter 2 fills the cap"
    );
}

#[test]
fn two_adapters_never_share_a_prefix_hit() {
    let mut s = with_loras(4);
    let prompt: Vec<u32> = (100..140).collect(); // two full blocks and more
    add_with(&mut s, "base", prompt.clone(), None);
    add_with(&mut s, "one", prompt.clone(), Some(1));
    step(&mut s);
    add_with(&mut s, "base2", prompt.clone(), None);
    add_with(&mut s, "one2", prompt.clone(), Some(1));
    add_with(&mut s, "two", prompt, Some(2));
    let rows = step(&mut s);
    let computed = |id: &str| rows.iter().find(|(r, _)| r == id).unwrap().1;
    assert_eq!((computed("base2"), computed("one2")), (32, 32));
    assert_eq!(
        computed("two"),
        0,
        "adapter 2 reads neither the base's nor adapter 1's blocks"
    );
}

#[test]
fn an_adapter_needs_an_id_of_one_or_more_and_no_cap_without_max_loras() {
    let mut uncapped = scheduler(Setup::default());
    for i in 1..=3 {
        add_with(&mut uncapped, &format!("r{i}"), vec![1, 2, 3], Some(i));
    }
    assert_eq!(ids(&step(&mut uncapped)), ["r1", "r2", "r3"]);
    let mut r = new_request("r", vec![1, 2, 3], 4);
    r.lora = Some(LoraAdapter {
        id: 0,
        name: "a".into(),
        path: "/a".into(),
    });
    let mut on = with_loras(1);
    let refused = on.add_request(r);
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("lora_int_id")));
    assert_eq!(on.num_unfinished_requests(), 0);
}
