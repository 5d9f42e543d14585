//! Where a prefill stops to save prompt-cache entries: a function of the request alone (its
//! length, its message ends, the every-N setting), so a fresh prefill and a resumed one run the
//! same passes. Knows nothing of states or files.

/// Where a prefill of `len` tokens stops to save an entry: every `every` tokens, and of the
/// request's message ends `marks` (in order, the end of the chat preamble first) the two where
/// requests diverge in practice: the end of the first message (a system prompt other clients
/// share) and the start of the last one (an edited or regenerated turn). Each cut is one more
/// layer-major pass (one more read of the streamed spine), so the other message ends are not
/// cut. Only cuts in `(start, len)`, ascending. A function of the request alone, so a fresh
/// prefill and one resumed from an entry run the same passes.
pub fn cut_points(len: usize, marks: &[usize], every: usize, start: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = Vec::new();
    if let Some(&first) = marks.get(1) {
        cuts.push(first);
    }
    if marks.len() >= 3 {
        cuts.push(marks[marks.len() - 2]);
    }
    if every > 0 {
        cuts.extend((1..).map(|k| k * every).take_while(|&c| c < len));
    }
    cuts.retain(|&c| c > start && c < len);
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_the_first_message_the_last_message_and_every_n() {
        // Preamble ends at 5; messages end at 40, 70, 90 and 130; the prompt is 140 tokens.
        let marks = [5, 40, 70, 90, 130];
        assert_eq!(cut_points(140, &marks, 0, 0), vec![40, 90]);
        assert_eq!(cut_points(140, &marks, 64, 0), vec![40, 64, 90, 128]);
        assert_eq!(cut_points(140, &marks, 64, 64), vec![90, 128]);
        assert_eq!(cut_points(140, &[5, 40], 0, 0), vec![40]);
        assert_eq!(cut_points(40, &[5, 40], 0, 0), Vec::<usize>::new());
        assert!(cut_points(140, &[], 0, 0).is_empty());
    }
}
