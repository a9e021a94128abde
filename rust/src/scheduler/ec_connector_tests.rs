//! An encoder-cache connector's side of the scheduler (docs/scheduling.md
//! §4.20), with a scripted connector: inputs it holds are loaded, not run
//! (cache space, no budget), requests whose inputs are in transit wait in
//! either pass, and the connector hears of every allocation, release and
//! finish, in vLLM's order.

use super::tests::{new_request, sampled, scheduler, Setup};
use super::Scheduler;
use crate::ec_connector::scripted::{EcCall, ScriptedEc};
use crate::multimodal::MultimodalInput;
use crate::scheduler_config::EncoderConfig;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Log = Arc<Mutex<Vec<EcCall>>>;
type InTransit = Arc<Mutex<HashMap<String, usize>>>;

fn with_connector(items: &[&str], compute: usize) -> (Scheduler, Log, InTransit) {
    let mut s = scheduler(Setup {
        budget: 64,
        max_num_seqs: 8,
        encoder: Some(EncoderConfig {
            compute_budget: compute,
            cache_size: 1000,
            disable_chunked_mm_input: false,
        }),
        ..Setup::default()
    });
    let log = Log::default();
    let in_transit = InTransit::default();
    let connector = ScriptedEc {
        items: items.iter().map(|&i| i.to_string()).collect(),
        in_transit: in_transit.clone(),
        log: log.clone(),
    };
    s.set_ec_connector(Box::new(connector)).unwrap();
    (s, log, in_transit)
}

fn add(s: &mut Scheduler, id: &str, prompt_len: u32, images: &[(usize, usize, &str)]) {
    let mut r = new_request(id, (100..100 + prompt_len).collect(), 2);
    r.mm_inputs = images
        .iter()
        .map(|&(offset, length, identifier)| MultimodalInput::new(offset, length, identifier))
        .collect();
    s.add_request(r).unwrap();
}

/// One step, applied: (request, tokens, inputs the encoder runs) per row.
fn step(s: &mut Scheduler) -> Vec<(String, usize, Vec<u32>)> {
    let out = s.schedule();
    let rows = out
        .entries
        .iter()
        .map(|e| {
            let run = out
                .scheduled_encoder_inputs
                .iter()
                .find(|x| x.slot == e.slot)
                .map_or(vec![], |x| x.input_ids.clone());
            (
                s.request(e.slot).unwrap().request_id.clone(),
                e.num_tokens,
                run,
            )
        })
        .collect();
    let (tokens, offsets) = sampled(s, &out, |_| Some(7));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    s.encoder_cache().unwrap().check_invariants().unwrap();
    rows
}

fn take(log: &Log) -> Vec<EcCall> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[test]
fn inputs_the_connector_holds_are_loaded_without_encoder_budget() {
    // Two 20-embedding images and a 20-embedding budget: the encoder could
    // run one; the connector holds the first, so both go in one step.
    let (mut s, log, _) = with_connector(&["a"], 20);
    add(&mut s, "r", 60, &[(4, 20, "a"), (30, 20, "b")]);
    assert_eq!(step(&mut s), vec![("r".into(), 60, vec![1])]);
    assert_eq!(
        take(&log),
        vec![
            EcCall::Ensure("r".into(), 0),
            EcCall::HasItem("a".into()),
            EcCall::HasItem("b".into()),
            // The encoder's input first, then the loaded one.
            EcCall::Alloc("r".into(), 1),
            EcCall::Alloc("r".into(), 0),
            // Both computed: released after the step.
            EcCall::Free("r".into(), 0),
            EcCall::Free("r".into(), 1),
        ]
    );
    // Its last token runs, and it finishes (max_tokens 2).
    assert_eq!(step(&mut s), vec![("r".into(), 1, vec![])]);
    assert_eq!(
        take(&log),
        vec![EcCall::Ensure("r".into(), 60), EcCall::Finished("r".into())]
    );
}

#[test]
fn without_the_connector_the_budget_cuts_before_the_second_image() {
    // The same request with a connector that holds nothing: the encoder
    // runs the first image; the second waits for the next step.
    let (mut s, _, _) = with_connector(&[], 20);
    add(&mut s, "r", 60, &[(4, 20, "a"), (30, 20, "b")]);
    assert_eq!(step(&mut s), vec![("r".into(), 30, vec![0])]);
    assert_eq!(step(&mut s), vec![("r".into(), 30, vec![1])]);
}

#[test]
fn a_request_whose_inputs_are_in_transit_waits_in_either_pass() {
    let (mut s, log, in_transit) = with_connector(&[], 100);
    in_transit.lock().unwrap().insert("r".into(), 2);
    add(&mut s, "r", 60, &[(4, 20, "a"), (40, 10, "b")]);
    add(&mut s, "q", 8, &[]);
    // Twice skipped while waiting (q, without images, is never asked).
    assert_eq!(step(&mut s), vec![("q".into(), 8, vec![])]);
    assert_eq!(step(&mut s), vec![("q".into(), 1, vec![])]);
    let asked: Vec<_> = take(&log)
        .into_iter()
        .filter(|c| matches!(c, EcCall::Ensure(..)))
        .collect();
    assert_eq!(asked, vec![EcCall::Ensure("r".into(), 0); 2]);
    // Admitted with a budget of 64 tokens: a 60-token prompt, whole.
    assert_eq!(step(&mut s), vec![("r".into(), 60, vec![0, 1])]);
    // Running: in transit again for one ask, it waits a step.
    in_transit.lock().unwrap().insert("r".into(), 1);
    assert_eq!(step(&mut s), vec![]);
    assert_eq!(step(&mut s), vec![("r".into(), 1, vec![])]);
}

#[test]
fn the_connector_is_refused_without_a_shared_encoder_or_after_a_request() {
    let mut s = scheduler(Setup::default());
    let err = s
        .set_ec_connector(Box::<ScriptedEc>::default())
        .unwrap_err();
    assert!(err.to_string().contains("needs an encoder"), "{err}");
    let (mut s, _, _) = with_connector(&[], 10);
    add(&mut s, "r", 8, &[]);
    let err = s
        .set_ec_connector(Box::<ScriptedEc>::default())
        .unwrap_err();
    assert!(
        err.to_string().contains("before the first request"),
        "{err}"
    );
}
