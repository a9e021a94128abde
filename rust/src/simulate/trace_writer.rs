//! An ironbatch-trace/1 file of a simulation (docs/trace-format.md): what
//! each step was given and what it decided, so `ironbatch replay` can check
//! the run on either backend. Written line by line as the run goes, so a
//! long run's trace never sits in memory.

use crate::error::Error;
use crate::request::NewRequest;
use crate::scheduler::Scheduler;
use crate::scheduler_config::{Policy, SchedulerConfig};
use crate::step::{Kind, StepOutput, UpdateOutput};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};

/// Writes one trace file.
pub struct TraceWriter {
    path: String,
    file: BufWriter<File>,
    line: String,
    step: u64,
    /// Request objects added since the last step line.
    adds: String,
}

fn io_error(path: &str, e: std::io::Error) -> Error {
    Error::invalid(format!("trace {path:?}: {e}"))
}

fn ints<T: std::fmt::Display>(out: &mut String, values: impl IntoIterator<Item = T>) {
    out.push('[');
    for (k, v) in values.into_iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        let _ = write!(out, "{v}");
    }
    out.push(']');
}

fn strings<'a>(out: &mut String, values: impl IntoIterator<Item = &'a String>) {
    out.push('[');
    for (k, v) in values.into_iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        // Request ids are workload indices: digits, nothing to escape.
        let _ = write!(out, "\"{v}\"");
    }
    out.push(']');
}

impl TraceWriter {
    /// Create (or truncate) the file at `path`.
    pub fn create(path: &str) -> Result<Self, Error> {
        let file = File::create(path).map_err(|e| io_error(path, e))?;
        Ok(TraceWriter {
            path: path.to_owned(),
            file: BufWriter::new(file),
            line: String::new(),
            step: 0,
            adds: String::new(),
        })
    }

    fn write_line(&mut self) -> Result<(), Error> {
        self.line.push('\n');
        let path = &self.path;
        self.file
            .write_all(self.line.as_bytes())
            .map_err(|e| io_error(path, e))?;
        self.line.clear();
        Ok(())
    }

    /// The header: the settings the format can describe.
    pub(crate) fn header(&mut self, c: &SchedulerConfig) -> Result<(), Error> {
        let policy = match c.policy {
            Policy::Fcfs => "fcfs",
            Policy::Priority => "priority",
        };
        let version = env!("CARGO_PKG_VERSION");
        let _ = write!(
            self.line,
            "{{\"format\":\"ironbatch-trace/1\",\"recorded_with\":\"ironbatch {version} simulate\",\
             \"seed\":0,\"config\":{{\"block_size\":{},\"num_blocks\":{},\"max_num_seqs\":{},\
             \"max_num_batched_tokens\":{},\"max_model_len\":{},\"enable_chunked_prefill\":{},\
             \"long_prefill_token_threshold\":{},\"enable_prefix_caching\":{},\"policy\":\"{policy}\"}}}}",
            c.cache.block_size,
            c.cache.num_blocks,
            c.max_num_seqs,
            c.max_num_batched_tokens,
            c.max_model_len,
            c.enable_chunked_prefill,
            c.long_prefill_token_threshold,
            c.cache.enable_prefix_caching,
        );
        self.write_line()
    }

    /// A request added before the coming step.
    pub(crate) fn note_add(&mut self, r: &NewRequest) {
        let a = &mut self.adds;
        a.push(if a.is_empty() { '[' } else { ',' });
        let _ = write!(
            a,
            "{{\"request_id\":\"{}\",\"prompt_token_ids\":",
            r.request_id
        );
        ints(a, &r.prompt_token_ids);
        let _ = write!(
            a,
            ",\"max_tokens\":{},\"min_tokens\":0,\"ignore_eos\":true,\"stop_token_ids\":[],\
             \"eos_token_id\":null,\"priority\":{},\"arrival_time\":{}}}",
            r.stop.max_tokens, r.priority, r.arrival_time
        );
    }

    /// One step line: the adds, the decisions, the tokens sampled
    /// (`tokens[offsets[i]..offsets[i + 1]]` for entry `i`), the update.
    pub(crate) fn step(
        &mut self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
        update: &UpdateOutput,
        slot_request: &[u32],
        sched: &Scheduler,
    ) -> Result<(), Error> {
        let id = |slot: u32| slot_request[slot as usize];
        let l = &mut self.line;
        let _ = write!(l, "{{\"step\":{},\"add\":", self.step);
        if self.adds.is_empty() {
            l.push_str("[]");
        } else {
            l.push_str(&self.adds);
            l.push(']');
            self.adds.clear();
        }
        l.push_str(",\"abort\":[],\"schedule\":{\"scheduled\":[");
        for (i, e) in step.entries.iter().enumerate() {
            if i > 0 {
                l.push(',');
            }
            let kind = match e.kind {
                Kind::New => "new",
                Kind::Resumed => "resumed",
                Kind::Running => "running",
            };
            let _ = write!(
                l,
                "[\"{}\",{},\"{kind}\",{},",
                id(e.slot),
                e.num_tokens,
                e.num_computed_tokens
            );
            ints(l, step.block_ids_of(i));
            l.push(']');
        }
        l.push_str("],\"preempted\":");
        let mut preempted = step.preempted_req_ids.clone();
        preempted.sort();
        strings(l, &preempted);
        l.push_str(",\"finished\":");
        let mut finished = step.finished_req_ids.clone();
        finished.sort();
        strings(l, &finished);
        l.push_str("},\"sampled\":[");
        for (i, e) in step.entries.iter().enumerate() {
            if i > 0 {
                l.push(',');
            }
            let _ = write!(l, "[\"{}\",", id(e.slot));
            ints(l, &tokens[offsets[i]..offsets[i + 1]]);
            l.push(']');
        }
        l.push_str("],\"outputs\":[");
        let mut start = 0;
        for (k, rec) in update.records.iter().enumerate() {
            if k > 0 {
                l.push(',');
            }
            let _ = write!(l, "[\"{}\",", id(rec.slot));
            ints(l, &update.tokens[start..rec.tokens_end]);
            start = rec.tokens_end;
            let finish = update.finished.iter().find(|f| f.record == k);
            match finish.and_then(|f| f.status.finish_reason()) {
                Some(reason) => {
                    let _ = write!(l, ",\"{reason}\",null]");
                }
                None => l.push_str(",null,null]"),
            }
        }
        let _ = write!(
            l,
            "],\"num_free_blocks\":{}}}",
            sched.kv().num_free_blocks()
        );
        self.step += 1;
        self.write_line()
    }

    /// Flush what is buffered.
    pub fn finish(&mut self) -> Result<(), Error> {
        let path = &self.path;
        self.file.flush().map_err(|e| io_error(path, e))
    }
}
