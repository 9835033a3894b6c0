//! Reading a case and making it smaller, layer by layer, and the results
//! that must be exact copies.

use super::*;

impl Embeddings {
    pub(super) fn read(r: &mut NpzReader) -> Result<Self> {
        let splits = Splits::read(r, true)?;
        let ids = r.ints("input_ids")?;
        let shape = ids.shape().to_vec();
        let n = ids.len();
        let upstream = to_rows(CaseDtype::read_any(r, "upstream")?, n, splits.width)?;
        Ok(Embeddings {
            splits,
            shape,
            ids: ids.iter().copied().collect(),
            upstream,
        })
    }

    pub(super) fn write(&self, w: &mut NpzWriter, dtype: CaseDtype) -> Result<()> {
        self.splits.write(w, dtype, true);
        w.add("input_ids", &shaped(&self.shape, self.ids.clone())?);
        let up = shaped(
            &with_width(&self.shape, self.splits.width),
            self.upstream.iter().copied().collect(),
        )?;
        dtype.add_reals(w, "upstream", &up);
        Ok(())
    }

    pub(super) fn keep_positions(&self, keep: &[usize]) -> Self {
        Embeddings {
            shape: vec![keep.len()],
            ids: keep.iter().map(|&p| self.ids[p]).collect(),
            upstream: self.upstream.select(Axis(0), keep),
            ..self.clone()
        }
    }

    pub(super) fn size(&self) -> (usize, usize) {
        let (n, h, s) = (self.ids.len(), self.splits.width, self.splits.sizes.len());
        let frozen = self.splits.trainable.iter().filter(|t| !**t).count();
        (
            2 * s + self.splits.vocab() * h + n * (1 + h),
            self.shape.len().saturating_sub(1) + frozen,
        )
    }

    pub(super) fn candidates(&self) -> Vec<(String, Inputs)> {
        let mut out = Vec::new();
        let wrap = |what: String, c: Embeddings| (what, Inputs::Embeddings(c));
        for (what, keep) in subsets(self.ids.len(), "id position") {
            out.push(wrap(what, self.keep_positions(&keep)));
        }
        for cut in self.splits.cuts() {
            let Some((splits, map)) = self.splits.apply(&cut) else {
                continue;
            };
            let new_id = |id: i64| map.get(id as usize).copied().flatten();
            let keep: Vec<usize> = (0..self.ids.len())
                .filter(|&p| new_id(self.ids[p]).is_some())
                .collect();
            if keep.is_empty() {
                continue;
            }
            let mut c = if keep.len() == self.ids.len() {
                self.clone()
            } else {
                self.keep_positions(&keep)
            };
            c.ids = c.ids.iter().map(|&id| new_id(id).unwrap_or(0)).collect();
            c.splits = splits;
            out.push(wrap(cut.what, c));
        }
        for h in widths(self.splits.width) {
            let c = Embeddings {
                splits: self.splits.narrow(h),
                upstream: self.upstream.slice(s![.., ..h]).to_owned(),
                ..self.clone()
            };
            out.push(wrap(format!("H {} → {h}", self.splits.width), c));
        }
        if self.shape.len() > 1 {
            let c = Embeddings {
                shape: vec![self.ids.len()],
                ..self.clone()
            };
            out.push(wrap(
                format!("ids of shape {} → 1-D", fmt_list(&self.shape)),
                c,
            ));
        }
        for k in 0..self.splits.sizes.len() {
            if !self.splits.trainable[k] {
                let mut c = self.clone();
                c.splits.trainable[k] = true;
                out.push(wrap(format!("split s{k} trainable"), c));
            }
        }
        out
    }

    pub(super) fn describe(&self) -> String {
        let shape = if self.shape.len() == 1 {
            String::new()
        } else {
            format!(" of shape {}", fmt_list(&self.shape))
        };
        format!(
            "{}, {}{shape} {}",
            self.splits.describe(),
            count(self.ids.len(), "id"),
            list_short(&self.ids)
        )
    }

    /// Whether element `i` of result `name` is a copy (exact).
    pub(super) fn exact(&self, name: &str) -> Exact {
        if name == "out" {
            return Exact::All;
        }
        let Some(k) = name
            .strip_prefix("grad_weight_")
            .and_then(|k| k.parse::<usize>().ok())
        else {
            return Exact::None;
        };
        // A row that at most one position reached is 0 or that position's
        // upstream row.
        let Some(&size) = self.splits.sizes.get(k) else {
            return Exact::None;
        };
        let mut reached = vec![0usize; size];
        for &id in &self.ids {
            if let Some((j, r)) = self.splits.locate(id.max(0) as usize)
                && j == k
            {
                reached[r] += 1;
            }
        }
        let h = self.splits.width;
        Exact::Mask(
            reached
                .iter()
                .flat_map(|&n| std::iter::repeat_n(n <= 1, h))
                .collect(),
        )
    }
}

impl Head {
    pub(super) fn read(r: &mut NpzReader) -> Result<Self> {
        let splits = Splits::read(r, false)?;
        let labels = r.ints("labels")?;
        let shape = labels.shape().to_vec();
        let n = labels.len();
        let hidden = to_rows(CaseDtype::read_any(r, "hidden")?, n, splits.width)?;
        let upstream = CaseDtype::read_any(r, "upstream")?
            .iter()
            .copied()
            .collect();
        Ok(Head {
            splits,
            shape,
            labels: labels.iter().copied().collect(),
            hidden,
            upstream,
        })
    }

    pub(super) fn write(&self, w: &mut NpzWriter, dtype: CaseDtype) -> Result<()> {
        self.splits.write(w, dtype, false);
        let hidden = shaped(
            &with_width(&self.shape, self.splits.width),
            self.hidden.iter().copied().collect(),
        )?;
        dtype.add_reals(w, "hidden", &hidden);
        w.add("labels", &shaped(&self.shape, self.labels.clone())?);
        dtype.add_reals(w, "upstream", &shaped(&self.shape, self.upstream.clone())?);
        Ok(())
    }

    pub(super) fn keep_tokens(&self, keep: &[usize]) -> Self {
        Head {
            shape: vec![keep.len()],
            labels: keep.iter().map(|&p| self.labels[p]).collect(),
            hidden: self.hidden.select(Axis(0), keep),
            upstream: keep.iter().map(|&p| self.upstream[p]).collect(),
            ..self.clone()
        }
    }

    /// Whether the logits reach the thousands (a hidden element above 100).
    pub(super) fn large_logits(&self) -> bool {
        self.hidden.iter().any(|x| x.abs() > 100.0)
    }

    pub(super) fn size(&self) -> (usize, usize) {
        let (n, h, s) = (
            self.labels.len(),
            self.splits.width,
            self.splits.sizes.len(),
        );
        (
            s + self.splits.vocab() * h + n * (2 + h),
            self.shape.len().saturating_sub(1) + usize::from(self.large_logits()),
        )
    }

    pub(super) fn candidates(&self, dtype: CaseDtype) -> Vec<(String, Inputs)> {
        let mut out = Vec::new();
        let wrap = |what: String, c: Head| (what, Inputs::Head(c));
        for (what, keep) in subsets(self.labels.len(), "token") {
            out.push(wrap(what, self.keep_tokens(&keep)));
        }
        for cut in self.splits.cuts() {
            let Some((splits, map)) = self.splits.apply(&cut) else {
                continue;
            };
            let new_label = |l: i64| match l {
                IGNORE => Some(IGNORE),
                l => map.get(l.max(0) as usize).copied().flatten(),
            };
            let keep: Vec<usize> = (0..self.labels.len())
                .filter(|&p| new_label(self.labels[p]).is_some())
                .collect();
            if keep.is_empty() {
                continue;
            }
            let mut c = if keep.len() == self.labels.len() {
                self.clone()
            } else {
                self.keep_tokens(&keep)
            };
            c.labels = c
                .labels
                .iter()
                .map(|&l| new_label(l).unwrap_or(0))
                .collect();
            c.splits = splits;
            out.push(wrap(cut.what, c));
        }
        for h in widths(self.splits.width) {
            let c = Head {
                splits: self.splits.narrow(h),
                hidden: self.hidden.slice(s![.., ..h]).to_owned(),
                ..self.clone()
            };
            out.push(wrap(format!("H {} → {h}", self.splits.width), c));
        }
        if self.shape.len() > 1 {
            let c = Head {
                shape: vec![self.labels.len()],
                ..self.clone()
            };
            out.push(wrap(
                format!("labels of shape {} → 1-D", fmt_list(&self.shape)),
                c,
            ));
        }
        if self.large_logits() {
            let c = Head {
                hidden: self.hidden.mapv(|x| dtype.round(x / 3000.0)),
                ..self.clone()
            };
            out.push(wrap("hidden states divided by 3000".into(), c));
        }
        out
    }

    pub(super) fn describe(&self) -> String {
        let shape = if self.shape.len() == 1 {
            String::new()
        } else {
            format!(" of shape {}", fmt_list(&self.shape))
        };
        let large = if self.large_logits() {
            ", logits in the thousands"
        } else {
            ""
        };
        format!(
            "{}, {}{shape}, labels {}{large}",
            self.splits.describe(),
            count(self.labels.len(), "token"),
            list_short(&self.labels)
        )
    }

    pub(super) fn exact(&self, name: &str) -> Exact {
        let ignored = self.labels.iter().map(|&l| l == IGNORE);
        match name {
            "loss" => Exact::Mask(ignored.collect()),
            "grad_hidden" => Exact::Mask(
                ignored
                    .flat_map(|i| std::iter::repeat_n(i, self.splits.width))
                    .collect(),
            ),
            _ => Exact::None,
        }
    }
}

impl Vocabulary {
    pub(super) fn read(r: &mut NpzReader) -> Result<Self> {
        let scalar_int = |r: &mut NpzReader, name: &str| -> Result<i64> {
            Ok(r.ints(name)?.iter().copied().next().unwrap_or(0))
        };
        let scalar_real = |r: &mut NpzReader, name: &str| -> Result<f64> {
            Ok(CaseDtype::read_any(r, name)?
                .iter()
                .copied()
                .next()
                .unwrap_or(0.0))
        };
        let vocab = scalar_int(r, "vocab_size")?.max(0) as usize;
        let languages = scalar_int(r, "n_languages")?.max(0) as usize;
        let language_index = r.ints_1d("language_index")?;
        let token_index = r.ints_1d("token_index")?;
        let n_rows = language_index.len();
        let rows = CaseDtype::read_any(r, "rows")?;
        let dim = rows.shape().get(1).copied().unwrap_or(0);
        let rows = to_rows(rows, n_rows, dim)?;
        let gate_logit = CaseDtype::read_any(r, "gate_logit")?
            .iter()
            .copied()
            .collect();
        let token_ids = r.ints_1d("token_ids")?;
        let language_ids = r.ints_1d("language_ids")?;
        let n = token_ids.len();
        let shared = to_rows(CaseDtype::read_any(r, "shared")?, n, dim)?;
        let upstream = to_rows(CaseDtype::read_any(r, "upstream")?, n, dim)?;
        Ok(Vocabulary {
            vocab,
            languages,
            language_index,
            token_index,
            rows,
            gate_logit,
            token_ids,
            language_ids,
            shared,
            upstream,
            use_gate: scalar_int(r, "use_gate")? == 1,
            penalty_weight: scalar_real(r, "penalty_weight")?,
            fusion_weight: scalar_real(r, "fusion_weight")?,
        })
    }

    pub(super) fn write(&self, w: &mut NpzWriter, dtype: CaseDtype) {
        let ids = |v: &[i64]| Array1::from(v.to_vec());
        w.add_scalar("vocab_size", self.vocab as i64);
        w.add_scalar("n_languages", self.languages as i64);
        w.add("language_index", &ids(&self.language_index));
        w.add("token_index", &ids(&self.token_index));
        dtype.add_reals(w, "rows", &self.rows);
        dtype.add_reals(w, "gate_logit", &Array1::from(self.gate_logit.clone()));
        w.add("token_ids", &ids(&self.token_ids));
        w.add("language_ids", &ids(&self.language_ids));
        dtype.add_reals(w, "shared", &self.shared);
        dtype.add_reals(w, "upstream", &self.upstream);
        w.add_scalar("use_gate", i64::from(self.use_gate));
        dtype.add_reals(w, "penalty_weight", &ndarray::arr0(self.penalty_weight));
        dtype.add_reals(w, "fusion_weight", &ndarray::arr0(self.fusion_weight));
    }

    pub(super) fn dim(&self) -> usize {
        self.rows.ncols()
    }

    pub(super) fn keep_tokens(&self, keep: &[usize]) -> Self {
        Vocabulary {
            token_ids: keep.iter().map(|&p| self.token_ids[p]).collect(),
            language_ids: keep.iter().map(|&p| self.language_ids[p]).collect(),
            shared: self.shared.select(Axis(0), keep),
            upstream: self.upstream.select(Axis(0), keep),
            ..self.clone()
        }
    }

    pub(super) fn keep_rows(&self, keep: &[usize]) -> Self {
        Vocabulary {
            language_index: keep.iter().map(|&i| self.language_index[i]).collect(),
            token_index: keep.iter().map(|&i| self.token_index[i]).collect(),
            rows: self.rows.select(Axis(0), keep),
            gate_logit: keep.iter().map(|&i| self.gate_logit[i]).collect(),
            ..self.clone()
        }
    }

    /// Without the vocabulary tokens (`tokens`) or the languages marked in
    /// `drop`: their index rows and the tokens that use them go, the others
    /// are renumbered. `None` when no row, no token or no id would be left.
    pub(super) fn without(&self, drop: &[bool], tokens: bool) -> Option<Self> {
        let mut map = vec![None; drop.len()];
        let mut next = 0i64;
        for (i, &d) in drop.iter().enumerate() {
            if !d {
                map[i] = Some(next);
                next += 1;
            }
        }
        if next == 0 {
            return None;
        }
        let new = |v: i64| map.get(v.max(0) as usize).copied().flatten();
        let (index, ids) = if tokens {
            (&self.token_index, &self.token_ids)
        } else {
            (&self.language_index, &self.language_ids)
        };
        let rows: Vec<usize> = (0..index.len())
            .filter(|&i| new(index[i]).is_some())
            .collect();
        let positions: Vec<usize> = (0..ids.len()).filter(|&p| new(ids[p]).is_some()).collect();
        if rows.is_empty() || positions.is_empty() {
            return None;
        }
        let mut c = self.keep_rows(&rows).keep_tokens(&positions);
        let renumber = |v: &mut Vec<i64>| v.iter_mut().for_each(|x| *x = new(*x).unwrap_or(0));
        if tokens {
            renumber(&mut c.token_index);
            renumber(&mut c.token_ids);
            c.vocab = next as usize;
        } else {
            renumber(&mut c.language_index);
            renumber(&mut c.language_ids);
            c.languages = next as usize;
        }
        Some(c)
    }

    pub(super) fn size(&self) -> (usize, usize) {
        let (n, d, r) = (self.token_ids.len(), self.dim(), self.rows.nrows());
        let weights = [self.penalty_weight, self.fusion_weight];
        (
            self.vocab + self.languages + r * (3 + d) + n * (2 + 2 * d) + 3,
            weights.iter().filter(|w| **w != 0.0).count(),
        )
    }

    pub(super) fn candidates(&self) -> Vec<(String, Inputs)> {
        let mut out = Vec::new();
        let wrap = |what: String, c: Vocabulary| (what, Inputs::Vocabulary(c));
        for (what, keep) in subsets(self.token_ids.len(), "token") {
            out.push(wrap(what, self.keep_tokens(&keep)));
        }
        for (what, keep) in subsets(self.rows.nrows(), "index row") {
            out.push(wrap(what, self.keep_rows(&keep)));
        }
        for (n, tokens, what) in [
            (self.vocab, true, "vocabulary token"),
            (self.languages, false, "language"),
        ] {
            if n > 1 {
                for t in 0..n {
                    let drop: Vec<bool> = (0..n).map(|i| i != t).collect();
                    if let Some(c) = self.without(&drop, tokens) {
                        out.push(wrap(format!("kept only {what} {t}"), c));
                    }
                }
                for t in 0..n {
                    let drop: Vec<bool> = (0..n).map(|i| i == t).collect();
                    if let Some(c) = self.without(&drop, tokens) {
                        out.push(wrap(format!("removed {what} {t}"), c));
                    }
                }
            }
        }
        for d in widths(self.dim()) {
            let c = Vocabulary {
                rows: self.rows.slice(s![.., ..d]).to_owned(),
                shared: self.shared.slice(s![.., ..d]).to_owned(),
                upstream: self.upstream.slice(s![.., ..d]).to_owned(),
                ..self.clone()
            };
            out.push(wrap(format!("D {} → {d}", self.dim()), c));
        }
        if self.penalty_weight != 0.0 {
            let c = Vocabulary {
                penalty_weight: 0.0,
                ..self.clone()
            };
            out.push(wrap("penalty_weight → 0".into(), c));
        }
        if self.fusion_weight != 0.0 {
            let c = Vocabulary {
                fusion_weight: 0.0,
                ..self.clone()
            };
            out.push(wrap("fusion_weight → 0".into(), c));
        }
        out
    }

    /// Whether each token has a row.
    pub(super) fn has_row(&self) -> Vec<bool> {
        let pairs: HashSet<(i64, i64)> = self
            .language_index
            .iter()
            .copied()
            .zip(self.token_index.iter().copied())
            .collect();
        self.language_ids
            .iter()
            .zip(&self.token_ids)
            .map(|(&l, &t)| pairs.contains(&(l, t)))
            .collect()
    }

    pub(super) fn describe(&self) -> String {
        let pairs: Vec<String> = self
            .language_index
            .iter()
            .zip(&self.token_index)
            .take(8)
            .map(|(l, t)| format!("({l}, {t})"))
            .collect();
        let more = if self.rows.nrows() > 8 { " …" } else { "" };
        let with_row = self.has_row().iter().filter(|h| **h).count();
        format!(
            "V = {}, L = {}, D = {}, {} (language, token) {}{more}, {} ({} with a row), {}, \
             penalty_weight {}, fusion_weight {}",
            self.vocab,
            self.languages,
            self.dim(),
            count(self.rows.nrows(), "index row"),
            pairs.join(" "),
            count(self.token_ids.len(), "token"),
            with_row,
            if self.use_gate {
                "gated"
            } else {
                "fusion mode"
            },
            num(self.penalty_weight),
            num(self.fusion_weight),
        )
    }

    pub(super) fn exact(&self, name: &str) -> Exact {
        if name != "out" && name != "grad_shared" {
            return Exact::None;
        }
        let d = self.dim();
        Exact::Mask(
            self.has_row()
                .into_iter()
                .flat_map(|has| std::iter::repeat_n(!has || !self.use_gate, d))
                .collect(),
        )
    }
}

/// Which elements of a result must be equal.
pub(super) enum Exact {
    None,
    All,
    /// Per element, row-major.
    Mask(Vec<bool>),
}

impl Exact {
    pub(super) fn at(&self, i: usize) -> bool {
        match self {
            Exact::None => false,
            Exact::All => true,
            Exact::Mask(m) => m.get(i).copied().unwrap_or(false),
        }
    }
}

impl FuzzCase {
    pub(super) fn read(layer: Layer, dtype: CaseDtype, bytes: Vec<u8>) -> Result<Self> {
        let mut r = NpzReader::from_bytes("generated case", bytes)?;
        let inputs = match layer {
            Layer::SplitEmbeddings => Inputs::Embeddings(Embeddings::read(&mut r)?),
            Layer::LmHead => Inputs::Head(Head::read(&mut r)?),
            Layer::SplitVocabulary => Inputs::Vocabulary(Vocabulary::read(&mut r)?),
        };
        Ok(FuzzCase { dtype, inputs })
    }

    pub(super) fn layer(&self) -> Layer {
        match self.inputs {
            Inputs::Embeddings(_) => Layer::SplitEmbeddings,
            Inputs::Head(_) => Layer::LmHead,
            Inputs::Vocabulary(_) => Layer::SplitVocabulary,
        }
    }

    /// The inputs as an npz writer.
    pub(super) fn writer(&self) -> Result<NpzWriter<'static>> {
        let mut w = NpzWriter::new("case.npz");
        match &self.inputs {
            Inputs::Embeddings(c) => c.write(&mut w, self.dtype)?,
            Inputs::Head(c) => c.write(&mut w, self.dtype)?,
            Inputs::Vocabulary(c) => c.write(&mut w, self.dtype),
        }
        Ok(w)
    }

    /// The size that shrinking decreases: the elements of the inputs (and
    /// V, L), then how many features the case has (rank above 1, frozen
    /// splits, logits in the thousands, non-zero penalty weights).
    pub(super) fn size(&self) -> (usize, usize) {
        match &self.inputs {
            Inputs::Embeddings(c) => c.size(),
            Inputs::Head(c) => c.size(),
            Inputs::Vocabulary(c) => c.size(),
        }
    }

    /// Smaller cases derived from this one, the largest reductions first.
    pub(super) fn candidates(&self) -> Vec<(String, FuzzCase)> {
        let list = match &self.inputs {
            Inputs::Embeddings(c) => c.candidates(),
            Inputs::Head(c) => c.candidates(self.dtype),
            Inputs::Vocabulary(c) => c.candidates(),
        };
        let size = self.size();
        list.into_iter()
            .map(|(what, inputs)| {
                (
                    what,
                    FuzzCase {
                        dtype: self.dtype,
                        inputs,
                    },
                )
            })
            .filter(|(_, c)| c.size() < size)
            .collect()
    }

    pub(super) fn describe(&self) -> String {
        match &self.inputs {
            Inputs::Embeddings(c) => c.describe(),
            Inputs::Head(c) => c.describe(),
            Inputs::Vocabulary(c) => c.describe(),
        }
    }

    pub(super) fn exact(&self, name: &str) -> Exact {
        match &self.inputs {
            Inputs::Embeddings(c) => c.exact(name),
            Inputs::Head(c) => c.exact(name),
            Inputs::Vocabulary(c) => c.exact(name),
        }
    }

    /// The relative tolerance of docs/golden.md: for the half types, that
    /// of an implementation computing in them.
    pub(super) fn rtol(&self) -> f64 {
        match (&self.inputs, self.dtype) {
            (_, CaseDtype::BF16) => 5e-2,
            (_, CaseDtype::F16) => 2e-2,
            (Inputs::Head(h), CaseDtype::F32) if h.large_logits() => 1e-3,
            (_, CaseDtype::F32) => 1e-5,
            (_, CaseDtype::F64) => 1e-9,
        }
    }
}
