//! What `deltafin run` shows: the reply as it streams (`Printer`: text split by the chat
//! format, reasoning dimmed on a terminal, or the ids), and the finished run's reports
//! (`Done`: the `--json` document, the closing lines, `--stats`, the event stream's end).

use deltafin::chat::{ChatOptions, Delta, ReplySplitter};
use deltafin::runtime::observers::ExpertReuse;
use deltafin::tokenizer::{StreamDecoder, Tokenizer};
use deltafin::{Engine, Generation, Model};

use super::events::Events;
use super::run::RunArgs;

/// Prints a reply as it streams (nothing with `--json`).
pub struct Printer<'a> {
    /// The tokenizer, when the prompt was text (else the ids are printed).
    tok: Option<&'a Tokenizer>,
    chat: bool,
    json: bool,
    dec: StreamDecoder,
    split: Box<dyn ReplySplitter>,
    dim: bool,
}

impl<'a> Printer<'a> {
    /// A printer for `engine`'s replies to `a`'s prompt.
    pub fn new(engine: &'a Engine, a: &RunArgs, thinking: bool) -> anyhow::Result<Self> {
        Ok(Printer {
            tok: a.prompt.is_some().then(|| engine.tokenizer()),
            chat: a.chat,
            json: a.json,
            dec: StreamDecoder::new(),
            split: engine
                .chat_format()
                .splitter(engine.tokenizer_arc(), thinking, false)?,
            dim: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        })
    }

    fn show(&self, deltas: Vec<Delta>) {
        for d in deltas {
            match d {
                Delta::Reasoning(t) if self.dim => eprint!("\x1b[2m{t}\x1b[0m"),
                Delta::Reasoning(t) => eprint!("{t}"),
                Delta::ToolCall(c) => println!("\n[tool call] {}({})", c.name, c.arguments),
                Delta::Content(t) => {
                    print!("{t}");
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                }
            }
        }
    }

    /// One generated token; `others_print` when `--stats` lines already show each token.
    pub fn token(&mut self, id: u32, others_print: bool) {
        if self.json {
            return;
        }
        match self.tok {
            Some(t) if self.chat => {
                let d = self.split.push_id(t, &mut self.dec, id);
                self.show(d)
            }
            Some(t) => {
                let d = vec![Delta::Content(self.dec.push(t, id))];
                self.show(d)
            }
            None if !others_print => eprint!("{id} "),
            None => {}
        }
    }

    /// The rest of the reply, once generation ended.
    pub fn finish(&mut self) {
        if self.json || self.tok.is_none() {
            return;
        }
        let d = match self.chat {
            true => self.split.finish(&mut self.dec),
            false => vec![Delta::Content(self.dec.finish())],
        };
        self.show(d);
        println!();
    }
}

/// The closing line: peak resident memory against the plan.
pub fn print_peak(model: &dyn Model) {
    let (_, peak) = deltafin::runtime::memory::rss();
    eprintln!(
        "peak RSS {:.2} GB{}",
        peak as f64 / 1e9,
        match model.plan() {
            Some(p) => format!(" (memory plan total {:.2} GB)", p.total as f64 / 1e9),
            None => String::new(),
        }
    );
}

/// A finished run, for its reports.
pub struct Done<'a> {
    pub gen: &'a Generation,
    pub prompt_ids: &'a [u32],
    pub prefill_read: Option<u64>,
    pub spec: serde_json::Value,
    /// The prompt was text (so the reply is decoded too).
    pub with_text: bool,
}

impl Done<'_> {
    /// The event stream's `end` line.
    pub fn emit_end(&self, mut events: Events, engine: &Engine) -> anyhow::Result<()> {
        let (gen, model) = (self.gen, engine.model());
        let decode_steps = gen.generated_ids.len().saturating_sub(1).max(1);
        events.emit(
            "end",
            serde_json::json!({
                "generated": gen.generated_ids.len(),
                "stop": gen.stop,
                "prefill_ms": gen.prefill_ms,
                "decode_ms_per_token": gen.decode_ms / decode_steps as f64,
                "experts": model.expert_stats(),
                "speculation": self.spec,
                "memory": super::store::memory_report(model),
                "prompt_cache": engine.prompt_cache().map(|c| c.stats()),
            }),
        )
    }

    /// The `--json` document.
    pub fn print_json(&self, engine: &Engine, chat: bool, opts: &ChatOptions) {
        let (gen, model) = (self.gen, engine.model());
        let text = self
            .with_text
            .then(|| engine.tokenizer().decode(&gen.generated_ids));
        let reply = (self.with_text && chat)
            .then(|| super::reply::reply_text(engine, &gen.generated_ids, chat, opts));
        let v = serde_json::json!({
            "text": text,
            "reply": reply,
            "prompt_ids": gen.prompt_ids,
            "generated_ids": gen.generated_ids,
            "first_step_top": gen.first_step_top.iter().map(|(i, l)| serde_json::json!([i, l])).collect::<Vec<_>>(),
            "stop": gen.stop,
            "prefill": {"tokens": self.prompt_ids.len(), "cached": gen.cached, "ms": gen.prefill_ms,
                "passes": self.prompt_ids.len().div_ceil(model.pass_len().max(1)),
                "bytes_read": self.prefill_read},
            "decode_ms_per_token": gen.decode_ms / gen.generated_ids.len().saturating_sub(1).max(1) as f64,
            "speculation": self.spec,
            "memory": super::store::memory_report(model),
            "prompt_cache": engine.prompt_cache().map(|c| c.stats()),
        });
        println!("{v}");
    }

    /// The closing lines on a terminal: the ids (without a tokenizer's text), the timings and
    /// the prompt cache.
    pub fn print_text(&self, engine: &Engine, a: &RunArgs, ids_only: bool) {
        let gen = self.gen;
        if ids_only {
            eprintln!();
            let ids: Vec<String> = gen.generated_ids.iter().map(|i| i.to_string()).collect();
            println!("{}", ids.join(","));
        }
        let steps = gen.generated_ids.len().saturating_sub(1).max(1);
        let secs = gen.decode_ms / 1e3;
        eprintln!(
            "[{} tokens, stop: {:?}; prefill {:.1} ms for {} tokens; decode {:.2} ms/token, {:.2} tok/s]",
            gen.generated_ids.len(),
            gen.stop,
            gen.prefill_ms,
            self.prompt_ids.len(),
            gen.decode_ms / steps as f64,
            if secs > 0.0 { steps as f64 / secs } else { 0.0 }
        );
        if let (true, Some(c)) = (a.stats, engine.prompt_cache()) {
            let s = c.stats();
            eprintln!(
                "prompt cache: {} of {} prompt tokens from an entry; {} hits ({} from disk) in {} lookups; {:.1} MB in RAM ({} entries), {:.1} MB on disk ({} files)",
                gen.cached,
                self.prompt_ids.len(),
                s.hits,
                s.disk_hits,
                s.lookups,
                s.ram_bytes as f64 / 1e6,
                s.ram_entries,
                s.disk_bytes as f64 / 1e6,
                s.disk_entries
            );
        }
    }

    /// `--stats`: the expert store's totals, speculation and expert reuse.
    pub fn print_stats(&self, model: &dyn Model, reuse: Option<&ExpertReuse>) {
        if let Some(s) = model.expert_stats() {
            eprintln!("total: {}", serde_json::to_string(&s).unwrap_or_default());
        }
        eprintln!("speculation: {}", self.spec);
        if let (Some(r), Some((top_k, experts))) = (reuse, model.routing()) {
            let layers: Vec<String> = r
                .per_layer()
                .iter()
                .map(|(l, s, _)| format!("L{l} {:.1}%", 100.0 * s))
                .collect();
            eprintln!(
                "expert reuse (share of a token's experts the previous token also used): {:.1}% overall (random routing: {:.1}%); {}",
                100.0 * r.overall(),
                100.0 * top_k as f64 / experts as f64,
                layers.join(", ")
            );
        }
    }
}
