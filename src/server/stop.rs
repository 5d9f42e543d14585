//! Stop sequences on decoded text: text is passed on as it comes, except the characters that
//! could still be the start of a stop sequence, which are held back until they cannot; a stop
//! sequence is found across token boundaries and neither it nor anything after it is passed on.
//! Knows nothing of tokens or requests.

/// Matches a request's stop sequences against its streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: bool,
}

impl StopMatcher {
    /// A matcher for these sequences (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: false,
        }
    }

    /// Whether a stop sequence was found (everything after it is dropped).
    pub fn matched(&self) -> bool {
        self.matched
    }

    /// Takes the next piece of text; returns the text that can be passed on now.
    pub fn push(&mut self, text: &str) -> String {
        if self.matched {
            return String::new();
        }
        if self.stops.is_empty() {
            return text.to_string();
        }
        self.held.push_str(text);
        // The earliest occurrence of any stop sequence ends the text there.
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            self.matched = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = self.partial_len();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// The held-back text, once the generation has ended without a match.
    pub fn finish(&mut self) -> String {
        if self.matched {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of `held` that are a proper prefix of some stop sequence (the longest).
    fn partial_len(&self) -> usize {
        let h = &self.held;
        for (i, _) in h.char_indices() {
            let tail = &h[i..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > tail.len() && s.starts_with(tail))
            {
                return tail.len();
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out: Vec<String> = pieces.iter().map(|p| m.push(p)).collect();
        out.push(m.finish());
        (out, m.matched())
    }

    #[test]
    fn finds_a_stop_across_pieces_and_holds_back_only_a_possible_start() {
        let (out, hit) = run(&["END"], &["abc E", "N", "D tail", "more"]);
        assert_eq!(out, ["abc ", "", "", "", ""]);
        assert!(hit);
        // A false start is released as soon as it cannot match.
        let (out, hit) = run(&["END"], &["xE", "Nx", "y"]);
        assert_eq!(out, ["x", "ENx", "y", ""]);
        assert!(!hit);
    }

    #[test]
    fn the_earliest_of_several_wins_and_unicode_is_cut_on_characters() {
        let (out, _) = run(&["zz", "é!"], &["aé", "!zz"]);
        assert_eq!(out.concat(), "a");
        let (out, hit) = run(&["\n\n"], &["ü\n", "ä"]);
        assert_eq!(out, ["ü", "\nä", ""]);
        assert!(!hit);
        // Held text at the end of the generation is passed on.
        let (out, _) = run(&["abc"], &["xab"]);
        assert_eq!(out.concat(), "xab");
    }

    #[test]
    fn no_stops_passes_everything() {
        let (out, hit) = run(&[], &["a", "b"]);
        assert_eq!(out.concat(), "ab");
        assert!(!hit);
    }
}
