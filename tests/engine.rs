//! The engine and session front door: a chat session feeds only each new turn, and what it
//! generates is what a fresh state prefilled with the same whole token sequence generates.

mod common;

use std::sync::atomic::AtomicBool;

use deltafin::chat::{encode_segments, render, ChatOptions, Message};
use deltafin::runtime::generate::argmax;
use deltafin::{Engine, EngineOptions, GenerateOptions, Generator};

fn greedy(l: &[f32]) -> u32 {
    argmax(l)
}

#[test]
fn a_chat_session_feeds_only_the_new_turn_and_matches_a_full_prefill() {
    let root = common::nano();
    let engine = Engine::open(&root, &EngineOptions::default()).unwrap();
    let chat = ChatOptions::default();
    let opts = GenerateOptions {
        max_new: 5,
        stop_ids: vec![engine.eos()],
        ..Default::default()
    };
    let no = AtomicBool::new(false);
    let mut s = engine.session(chat.clone());
    let first = [Message::new("user", "Hello there")];
    let t1 = s
        .chat_turn(&first, &opts, &no, &mut |l: &[f32]| greedy(l), |_| {})
        .unwrap();
    let full1 = encode_segments(engine.tokenizer(), &render(&first, &chat).unwrap());
    assert_eq!(
        t1.generation.prompt_ids, full1,
        "the first turn renders it all"
    );
    let after1 = s.tokens();
    assert_eq!(
        after1.len(),
        full1.len() + t1.generation.generated_ids.len()
    );
    assert_eq!(
        s.state().pos,
        after1.len() - 1,
        "all but the last token fed"
    );

    let t2 = s
        .chat_turn(
            &[Message::new("user", "What is 2+2?")],
            &opts,
            &no,
            &mut |l: &[f32]| greedy(l),
            |_| {},
        )
        .unwrap();
    let fed2 = &t2.generation.prompt_ids;
    // Only the new turn: the previous reply's last token, its closing, the new message.
    assert!(
        fed2.len() < full1.len(),
        "{} vs {}",
        fed2.len(),
        full1.len()
    );
    assert_eq!(fed2[0], *after1.last().unwrap());
    let whole = s.tokens();
    assert_eq!(
        whole[..after1.len()],
        after1[..],
        "the session extends its own tokens"
    );
    assert_eq!(s.history().len(), 4, "two user messages and two replies");

    // The same tokens through a fresh state give the same reply, bit for bit.
    let prompt: Vec<u32> = whole[..whole.len() - t2.generation.generated_ids.len()].to_vec();
    let mut fresh = engine.model().new_state();
    let g = Generator::new(engine.model())
        .generate(&mut fresh, &prompt, &opts, &no, |_| {})
        .unwrap();
    assert_eq!(g.generated_ids, t2.generation.generated_ids);
    assert_eq!(g.first_step_top, t2.generation.first_step_top);

    // Snapshot and restore: the same next turn twice.
    let snap = s.snapshot();
    let next = [Message::new("user", "And 3+3?")];
    let a = s
        .chat_turn(&next, &opts, &no, &mut |l: &[f32]| greedy(l), |_| {})
        .unwrap();
    s.restore(&snap);
    let b = s
        .chat_turn(&next, &opts, &no, &mut |l: &[f32]| greedy(l), |_| {})
        .unwrap();
    assert_eq!(a.generation.generated_ids, b.generation.generated_ids);
    assert_eq!(a.generation.prompt_ids, b.generation.prompt_ids);

    // A failed pass (an id outside the vocabulary) leaves no half-fed state behind.
    assert!(s.prefill(&[u32::MAX]).is_err());
    assert!(s.tokens().is_empty() && s.state().pos == 0);
    s.restore(&snap);

    // A turn cancelled before its first token leaves the session as it was before the turn
    // (issue 28): the same position and history, and the next turn feeds what a session that
    // never saw the cancelled one feeds.
    let (pos, turns) = (s.state().pos, s.history().len());
    assert!(pos > 0);
    let cancel = AtomicBool::new(true);
    let c = s
        .chat_turn(
            &[Message::new("user", "stop")],
            &opts,
            &cancel,
            &mut |l: &[f32]| greedy(l),
            |_| {},
        )
        .unwrap();
    assert!(c.generation.generated_ids.is_empty());
    assert_eq!((s.state().pos, s.history().len()), (pos, turns));
    let again = [Message::new("user", "again")];
    let d = s
        .chat_turn(&again, &opts, &no, &mut |l: &[f32]| greedy(l), |_| {})
        .unwrap();
    s.restore(&snap);
    let e = s
        .chat_turn(&again, &opts, &no, &mut |l: &[f32]| greedy(l), |_| {})
        .unwrap();
    assert_eq!(d.generation.prompt_ids, e.generation.prompt_ids);
    assert_eq!(d.generation.generated_ids, e.generation.generated_ids);
}
