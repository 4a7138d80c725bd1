//! Which of a folder's files make its model, as the loaders that wrote it read them back: an
//! index first, then the one file transformers or diffusers load, then the folder's files.
//!
//! Repositories keep other files beside the model: diffusers' half-precision variants
//! (`diffusion_pytorch_model.fp16.safetensors`), Mistral's `consolidated.safetensors`, a second
//! checkpoint with another VAE. Read together they would make one model holding every tensor
//! twice.

use super::index::INDEX_FILE_NAME;
use crate::text::natural_cmp;
use std::collections::{BTreeMap, HashSet};

/// The single files the loaders look for, in the order stui prefers them: transformers', then
/// diffusers'.
pub const LOADERS_FILES: [&str; 2] = ["model.safetensors", "diffusion_pytorch_model.safetensors"];

/// The files beside a model, other than `config.json`, that say how it is quantized: `AutoGPTQ`'s
/// and `AutoAWQ`'s configs, `ModelOpt`'s, and quanto's map of its weights.
pub const QUANT_SIDE_FILES: [&str; 4] = [
    "quantize_config.json",
    "quant_config.json",
    "hf_quant_config.json",
    "quanto_qmap.json",
];

/// The indexes the loaders look for, in the same order.
const LOADERS_INDEXES: [&str; 2] = [
    INDEX_FILE_NAME,
    "diffusion_pytorch_model.safetensors.index.json",
];

/// What a folder's model is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// An index, by its name in the folder.
    Index(String),
    /// Files with no index.
    Files(Files),
    /// Several indexes, none of them a loader's own: which model is meant is the user's to say.
    Indexes(Vec<String>),
}

/// The files read and those passed over, each in natural order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Files {
    pub read: Vec<String>,
    /// The folder's other `.safetensors` files, when a loader's own file was chosen among them.
    pub left: Vec<String>,
    /// The files read are neither one file nor one set of shards (`NAME-00001-of-00003…`):
    /// parts read side by side, which are one model only if no two hold the same tensor.
    pub parts: bool,
}

/// The model among `names`, a folder's file names; `None` when it holds neither an index nor a
/// `.safetensors` file.
pub fn choose<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Choice> {
    let mut indexes = Vec::new();
    let mut variant_indexes = Vec::new();
    let mut files = Vec::new();
    for name in names {
        if name.ends_with(".safetensors.index.json") {
            indexes.push(name);
        } else if variant_of_index(name).is_some() {
            variant_indexes.push(name);
        } else if name.ends_with(".safetensors") {
            files.push(name.to_owned());
        }
    }
    if let Some(index) = LOADERS_INDEXES.iter().find(|i| indexes.contains(i)) {
        return Some(Choice::Index((*index).to_owned()));
    }
    match &indexes[..] {
        [] => {}
        [only] => return Some(Choice::Index((*only).to_owned())),
        several => {
            let mut several: Vec<String> = several.iter().map(|&n| n.to_owned()).collect();
            several.sort_by(|a, b| natural_cmp(a, b));
            return Some(Choice::Indexes(several));
        }
    }
    if let Some(index) = only_variants_index(&variant_indexes, &files) {
        return Some(Choice::Index(index.to_owned()));
    }
    if files.is_empty() {
        return None;
    }
    files.sort_by(|a, b| natural_cmp(a, b));
    if let Some(own) = LOADERS_FILES.iter().find(|f| files.iter().any(|n| n == *f)) {
        files.retain(|n| n != own);
        return Some(Choice::Files(Files {
            read: vec![(*own).to_owned()],
            left: files,
            parts: false,
        }));
    }
    let parts = files.len() > 1 && !one_set_of_shards(&files);
    Some(Choice::Files(Files {
        read: files,
        left: Vec::new(),
        parts,
    }))
}

/// [`choose`], or [`choose_variant`] where a variant is asked for.
pub fn choose_save<'a>(
    names: impl IntoIterator<Item = &'a str>,
    variant: Option<&str>,
) -> Result<Option<Choice>, String> {
    match variant {
        None => Ok(choose(names)),
        Some(variant) => choose_variant(names, variant).map(Some),
    }
}

/// The save `variant` (`fp16`) among a folder's `names`, as `from_pretrained(..., variant=V)`
/// looks for it: a loader's variant index (`model.safetensors.index.V.json`), else the only
/// variant index of another stem, else a loader's variant file (`model.V.safetensors`), the
/// folder's other `.safetensors` files then passed over. The error says what the folder holds.
pub fn choose_variant<'a>(
    names: impl IntoIterator<Item = &'a str>,
    variant: &str,
) -> Result<Choice, String> {
    let names: Vec<&str> = names.into_iter().collect();
    let mut indexes: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| variant_of_index(name).is_some_and(|(_, v)| v == variant))
        .collect();
    let loaders_index = LOADERS_INDEXES.iter().find_map(|index| {
        let (stem, _) = index.split_once(".index.json")?;
        let name = format!("{stem}.index.{variant}.json");
        indexes.contains(&name.as_str()).then_some(name)
    });
    if let Some(index) = loaders_index {
        return Ok(Choice::Index(index));
    }
    match &mut indexes[..] {
        [] => {}
        [only] => return Ok(Choice::Index((*only).to_owned())),
        several => {
            several.sort_by(|a, b| natural_cmp(a, b));
            return Ok(Choice::Indexes(
                several.iter().map(|&n| n.to_owned()).collect(),
            ));
        }
    }
    let own = LOADERS_FILES
        .iter()
        .map(|file| with_variant(file, variant))
        .find(|file| names.contains(&file.as_str()));
    if let Some(own) = own {
        let mut left: Vec<String> = names
            .iter()
            .filter(|&&name| name.ends_with(".safetensors") && name != own)
            .map(|&name| name.to_owned())
            .collect();
        left.sort_by(|a, b| natural_cmp(a, b));
        return Ok(Choice::Files(Files {
            read: vec![own],
            left,
            parts: false,
        }));
    }
    let looked_for = format!(
        "no `{variant}` variant (no `*.safetensors.index.{variant}.json`, `{}` or `{}`)",
        with_variant(LOADERS_FILES[0], variant),
        with_variant(LOADERS_FILES[1], variant)
    );
    // Shards of the variant without its index are not the variant as the loaders read it.
    let mut others = variants_in(names.iter().copied());
    others.retain(|other| other != variant);
    Err(if others.is_empty() {
        format!("{looked_for}, and no other variant: open it without one")
    } else {
        format!("{looked_for}; its variants: {}", listed(&others))
    })
}

/// `name` with `variant` before its last extension, as the loaders name a variant's files:
/// `model.fp16.safetensors`, `model.safetensors.index.fp16.json`.
fn with_variant(name: &str, variant: &str) -> String {
    match name.rsplit_once('.') {
        Some((stem, extension)) => format!("{stem}.{variant}.{extension}"),
        None => format!("{name}.{variant}"),
    }
}

/// The variants among a folder's `names`: of its variant indexes and of the loaders' files
/// (`model.V.safetensors`, `model.V-00001-of-00002.safetensors`), sorted.
pub fn variants_in<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let stems = LOADERS_FILES.map(|file| file.trim_end_matches(".safetensors"));
    let mut variants: Vec<String> = names
        .into_iter()
        .filter_map(|name| {
            if let Some((_, variant)) = variant_of_index(name) {
                return Some(variant);
            }
            let base = name.strip_suffix(".safetensors")?;
            let (stem, variant) = base.split_once('.')?;
            let sharded = format!("{variant}.safetensors");
            let variant = match shard_set(&sharded) {
                Some((stem, _)) => &variant[..stem.len()],
                None => variant,
            };
            (stems.contains(&stem) && !variant.is_empty() && !variant.contains('.'))
                .then_some(variant)
        })
        .map(str::to_owned)
        .collect();
    variants.sort_by(|a, b| natural_cmp(a, b));
    variants.dedup();
    variants
}

/// What a folder's model read through `index` leaves out, among the folder's `names`: its other
/// indexes first (a variant's opens that variant), then the `.safetensors` files that are none of
/// the index's `shards`, each in natural order.
pub fn beside_index<'a>(
    names: impl IntoIterator<Item = &'a str>,
    index: &str,
    shards: &[String],
) -> Vec<String> {
    let shards: HashSet<&str> = shards.iter().map(String::as_str).collect();
    let mut indexes = Vec::new();
    let mut files = Vec::new();
    for name in names.into_iter().filter(|&name| name != index) {
        if name.ends_with(".safetensors.index.json") || variant_of_index(name).is_some() {
            indexes.push(name.to_owned());
        } else if name.ends_with(".safetensors") && !shards.contains(name) {
            files.push(name.to_owned());
        }
    }
    indexes.sort_by(|a, b| natural_cmp(a, b));
    files.sort_by(|a, b| natural_cmp(a, b));
    indexes.extend(files);
    indexes
}

/// The most subfolders looked into for a model.
pub const SUBFOLDERS_LOOKED_AT: usize = 256;

/// The most names read of each subfolder: a component's folder holds a few files, and a folder of
/// a million images beside a model is not read through each time the model opens.
pub const NAMES_LOOKED_AT: usize = 4096;

/// The subfolders among `paths` (each `SUBFOLDER/NAME`, below a folder without a model of its
/// own) whose files make a model, in natural order: a diffusers pipeline's components.
pub fn subfolders_with_models<'a>(paths: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut by_folder: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for path in paths {
        if let Some((folder, name)) = path.split_once('/')
            && !name.contains('/')
            && (by_folder.len() < SUBFOLDERS_LOOKED_AT || by_folder.contains_key(folder))
        {
            by_folder.entry(folder).or_default().push(name);
        }
    }
    let mut found: Vec<String> = by_folder
        .into_iter()
        .filter(|(_, names)| choose(names.iter().copied()).is_some())
        .map(|(folder, _)| folder.to_owned())
        .collect();
    found.sort_by(|a, b| natural_cmp(a, b));
    found
}

/// The error for a folder of several indexes, none of them a loader's own.
pub fn several_indexes(folder: &str, indexes: &[String]) -> String {
    format!(
        "{folder}: {} indexes and none is `{INDEX_FILE_NAME}`: open one of them by its path ({})",
        indexes.len(),
        listed(indexes)
    )
}

/// Names in backticks, the first few of many with how many more.
pub fn listed(names: &[String]) -> String {
    crate::text::listed_in_backticks(names, 4)
}

/// The stem and variant of a variant's index, as transformers and diffusers name it:
/// `("model", "fp16")` for `model.safetensors.index.fp16.json`.
fn variant_of_index(name: &str) -> Option<(&str, &str)> {
    let (stem, rest) = name.split_once(".safetensors.index.")?;
    let variant = rest.strip_suffix(".json")?;
    (!variant.is_empty() && !variant.contains('.')).then_some((stem, variant))
}

/// The index of a folder that holds one variant alone, as `from_pretrained(..., variant=V)`
/// downloads it: the only variant index, when every file is that variant's
/// (`STEM.V-00001-of-00002.safetensors`).
fn only_variants_index<'a>(variant_indexes: &[&'a str], files: &[String]) -> Option<&'a str> {
    let [index] = variant_indexes else {
        return None;
    };
    let (stem, variant) = variant_of_index(index)?;
    let prefix = format!("{stem}.{variant}");
    files
        .iter()
        .all(|name| {
            name.strip_prefix(&prefix)
                .is_some_and(|rest| rest.starts_with('-') || rest == ".safetensors")
        })
        .then_some(*index)
}

/// True when every name is `STEM-I-of-N.safetensors` with the same `STEM` and `N`.
fn one_set_of_shards(names: &[String]) -> bool {
    let mut sets = names.iter().map(|name| shard_set(name));
    let Some(Some(first)) = sets.next() else {
        return false;
    };
    sets.all(|set| set == Some(first))
}

/// The stem and count of a shard's name, `("model", "00003")` for
/// `model-00001-of-00003.safetensors`.
fn shard_set(name: &str) -> Option<(&str, &str)> {
    let base = name.strip_suffix(".safetensors")?;
    let (head, count) = base.rsplit_once("-of-")?;
    let (stem, number) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(count) && digits(number)).then_some((stem, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Names of the kinds folders hold, loaders' own among them.
    fn folder_names() -> impl Strategy<Value = Vec<String>> {
        let name = prop_oneof![
            Just("model.safetensors".to_owned()),
            Just("diffusion_pytorch_model.safetensors".to_owned()),
            Just("model.fp16.safetensors".to_owned()),
            Just("config.json".to_owned()),
            Just("model.safetensors.index.json".to_owned()),
            Just("model.safetensors.index.fp16.json".to_owned()),
            Just("model.fp16-00001-of-00002.safetensors".to_owned()),
            "[a-c]{1,3}\\.safetensors(\\.index\\.json)?",
            (1u32..4, 2u32..4).prop_map(|(i, n)| format!("model-{i:05}-of-{n:05}.safetensors")),
        ];
        proptest::collection::btree_set(name, 0..7).prop_map(|set| set.into_iter().collect())
    }

    proptest! {
        /// Whatever the folder's order, the choice is the same; files are read or passed over,
        /// never both and never lost; a loader's own file is read alone; an index wins, and
        /// beside it every other index and every file it does not name is named.
        #[test]
        fn every_file_is_read_or_named(names in folder_names(), seed in any::<u64>()) {
            let mut shuffled = names.clone();
            shuffled.sort_by_key(|n| {
                n.bytes().fold(seed, |h, b| h.rotate_left(5) ^ u64::from(b))
            });
            let choice = choose(names.iter().map(String::as_str));
            prop_assert_eq!(&choice, &choose(shuffled.iter().map(String::as_str)));
            let has_index = names.iter().any(|n| n.ends_with(".safetensors.index.json"));
            let mut files: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            match choice {
                Some(Choice::Index(index)) => {
                    prop_assert!(names.contains(&index));
                    // The index names some of the files, drawn from the seed.
                    let shards: Vec<String> = files
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| seed >> (i % 64) & 1 == 1)
                        .map(|(_, n)| (*n).to_owned())
                        .collect();
                    let left = beside_index(names.iter().map(String::as_str), &index, &shards);
                    for name in &names {
                        let is_index = name.ends_with(".safetensors.index.json")
                            || variant_of_index(name).is_some();
                        let expected_left = if *name == index {
                            false
                        } else if is_index {
                            true
                        } else {
                            name.ends_with(".safetensors") && !shards.contains(name)
                        };
                        prop_assert_eq!(left.contains(name), expected_left, "{}", name);
                    }
                    let first_file = left.iter().position(|n| n.ends_with(".safetensors"));
                    let indexes_first = left
                        .iter()
                        .skip(first_file.unwrap_or(left.len()))
                        .all(|n| n.ends_with(".safetensors"));
                    prop_assert!(indexes_first, "{:?}", left);
                }
                Some(Choice::Files(chosen)) => {
                    prop_assert!(!has_index || !names.contains(&INDEX_FILE_NAME.to_owned()));
                    let mut seen: Vec<&str> =
                        chosen.read.iter().chain(&chosen.left).map(String::as_str).collect();
                    seen.sort_unstable();
                    files.sort_unstable();
                    prop_assert_eq!(seen, files);
                    prop_assert!(!chosen.read.is_empty());
                    if let Some(own) = LOADERS_FILES.iter().find(|f| names.iter().any(|n| n == *f)) {
                        prop_assert_eq!(&chosen.read, &vec![(*own).to_owned()]);
                    } else {
                        prop_assert!(chosen.left.is_empty());
                    }
                }
                Some(Choice::Indexes(several)) => {
                    prop_assert!(several.len() > 1);
                    prop_assert!(!names.contains(&INDEX_FILE_NAME.to_owned()));
                }
                None => prop_assert!(files.is_empty() && !has_index),
            }
        }

        /// A variant asked for is read from its own files alone, every other `.safetensors`
        /// file named; without it, the error names the variants the folder has, that one never.
        #[test]
        fn a_variant_reads_its_own_files_alone(names in folder_names()) {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            match choose_variant(names.iter().copied(), "fp16") {
                Ok(Choice::Index(index)) => {
                    prop_assert!(names.contains(&index.as_str()));
                    prop_assert_eq!(variant_of_index(&index).map(|(_, v)| v), Some("fp16"));
                }
                Ok(Choice::Files(chosen)) => {
                    prop_assert_eq!(&chosen.read, &vec!["model.fp16.safetensors".to_owned()]);
                    let others = names
                        .iter()
                        .filter(|n| n.ends_with(".safetensors") && **n != "model.fp16.safetensors")
                        .count();
                    prop_assert_eq!(chosen.left.len(), others);
                }
                Ok(Choice::Indexes(several)) => prop_assert!(several.len() > 1),
                Err(why) => {
                    prop_assert!(!names.contains(&"model.fp16.safetensors"), "{}", why);
                    prop_assert!(!why.contains("its variants: `fp16`"), "{}", why);
                }
            }
        }
    }

    fn files(read: &[&str], left: &[&str], parts: bool) -> Choice {
        let owned = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        Choice::Files(Files {
            read: owned(read),
            left: owned(left),
            parts,
        })
    }

    #[test]
    fn a_variant_is_read_as_the_loaders_read_it() {
        let pipeline_unet = [
            "config.json",
            "diffusion_pytorch_model.safetensors",
            "diffusion_pytorch_model.fp16.safetensors",
        ];
        assert_eq!(
            choose_variant(pipeline_unet, "fp16"),
            Ok(files(
                &["diffusion_pytorch_model.fp16.safetensors"],
                &["diffusion_pytorch_model.safetensors"],
                false
            ))
        );
        let sharded = [
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.fp16.json",
            "model.fp16-00001-of-00002.safetensors",
            "model.fp16-00002-of-00002.safetensors",
            "model.bf16.safetensors",
        ];
        assert_eq!(
            choose_variant(sharded, "fp16"),
            Ok(Choice::Index("model.safetensors.index.fp16.json".into()))
        );
        assert_eq!(
            choose_variant(sharded, "bf16"),
            Ok(files(
                &["model.bf16.safetensors"],
                &[
                    "model-00001-of-00002.safetensors",
                    "model-00002-of-00002.safetensors",
                    "model.fp16-00001-of-00002.safetensors",
                    "model.fp16-00002-of-00002.safetensors",
                ],
                false
            ))
        );
        // Another stem's variant index, the only one: taken as a lone index is.
        assert_eq!(
            choose_variant(["text_encoder.safetensors.index.fp16.json"], "fp16"),
            Ok(Choice::Index(
                "text_encoder.safetensors.index.fp16.json".into()
            ))
        );
        assert_eq!(
            choose_variant(sharded, "int8"),
            Err("no `int8` variant (no `*.safetensors.index.int8.json`, \
                 `model.int8.safetensors` or `diffusion_pytorch_model.int8.safetensors`); its \
                 variants: `bf16`, `fp16`"
                .into())
        );
        assert_eq!(
            choose_variant(["model.safetensors"], "fp16"),
            Err("no `fp16` variant (no `*.safetensors.index.fp16.json`, \
                 `model.fp16.safetensors` or `diffusion_pytorch_model.fp16.safetensors`), and \
                 no other variant: open it without one"
                .into())
        );
    }

    #[test]
    fn an_index_comes_first_and_the_loaders_own_before_others() {
        let names = [
            "consolidated.safetensors",
            "model-00002-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "config.json",
        ];
        assert_eq!(
            choose(names),
            Some(Choice::Index("model.safetensors.index.json".into()))
        );
        let diffusers = [
            "diffusion_pytorch_model.safetensors.index.json",
            "other.safetensors.index.json",
        ];
        assert_eq!(
            choose(diffusers),
            Some(Choice::Index(
                "diffusion_pytorch_model.safetensors.index.json".into()
            ))
        );
        assert_eq!(
            choose(["a.safetensors", "b.safetensors.index.json"]),
            Some(Choice::Index("b.safetensors.index.json".into()))
        );
        assert_eq!(
            choose(["b.safetensors.index.json", "a.safetensors.index.json"]),
            Some(Choice::Indexes(vec![
                "a.safetensors.index.json".into(),
                "b.safetensors.index.json".into()
            ]))
        );
    }

    #[test]
    fn a_variants_index_serves_a_folder_of_that_variant_alone() {
        let variant = [
            "diffusion_pytorch_model.fp16-00001-of-00002.safetensors",
            "diffusion_pytorch_model.fp16-00002-of-00002.safetensors",
            "diffusion_pytorch_model.safetensors.index.fp16.json",
            "config.json",
        ];
        assert_eq!(
            choose(variant),
            Some(Choice::Index(
                "diffusion_pytorch_model.safetensors.index.fp16.json".into()
            ))
        );
        // Beside the default save, the variant is passed over as the loaders pass it.
        let both = [
            "diffusion_pytorch_model-00001-of-00001.safetensors",
            "diffusion_pytorch_model.safetensors.index.json",
            "diffusion_pytorch_model.fp16-00001-of-00001.safetensors",
            "diffusion_pytorch_model.safetensors.index.fp16.json",
        ];
        assert_eq!(
            choose(both),
            Some(Choice::Index(
                "diffusion_pytorch_model.safetensors.index.json".into()
            ))
        );
        // A file of another save beside the variant's: not the variant alone.
        let mixed = [
            "model.fp16-00001-of-00001.safetensors",
            "model.safetensors.index.fp16.json",
            "other.safetensors",
        ];
        assert!(matches!(choose(mixed), Some(Choice::Files(_))));
        assert_eq!(variant_of_index("model.safetensors.index.json"), None);
        assert_eq!(variant_of_index("model.safetensors.index..json"), None);
    }

    #[test]
    fn a_loaders_own_file_is_read_alone() {
        assert_eq!(
            choose([
                "diffusion_pytorch_model.fp16.safetensors",
                "diffusion_pytorch_model.safetensors",
                "config.json",
            ]),
            Some(files(
                &["diffusion_pytorch_model.safetensors"],
                &["diffusion_pytorch_model.fp16.safetensors"],
                false
            ))
        );
        assert_eq!(
            choose([
                "reference.safetensors",
                "model.safetensors",
                "consolidated.safetensors"
            ]),
            Some(files(
                &["model.safetensors"],
                &["consolidated.safetensors", "reference.safetensors"],
                false
            ))
        );
    }

    #[test]
    fn shards_with_no_index_are_one_model_and_other_files_are_parts() {
        assert_eq!(
            choose([
                "model-00010-of-00010.safetensors",
                "model-00002-of-00010.safetensors",
            ]),
            Some(files(
                &[
                    "model-00002-of-00010.safetensors",
                    "model-00010-of-00010.safetensors"
                ],
                &[],
                false
            ))
        );
        assert_eq!(
            choose(["model.fp16-00001-of-00002.safetensors"]),
            Some(files(
                &["model.fp16-00001-of-00002.safetensors"],
                &[],
                false
            ))
        );
        assert_eq!(
            choose(["ae.safetensors", "flux1-dev.safetensors"]),
            Some(files(
                &["ae.safetensors", "flux1-dev.safetensors"],
                &[],
                true
            ))
        );
        assert_eq!(
            choose([
                "model-00001-of-00002.safetensors",
                "model-00001-of-00003.safetensors",
            ]),
            Some(files(
                &[
                    "model-00001-of-00002.safetensors",
                    "model-00001-of-00003.safetensors"
                ],
                &[],
                true
            ))
        );
        assert_eq!(choose(["config.json", "notes.txt"]), None);
    }

    #[test]
    fn many_names_are_listed_with_a_count() {
        let names: Vec<String> = (1..=6).map(|i| format!("{i}.safetensors")).collect();
        assert_eq!(listed(&names[..1]), "`1.safetensors`");
        assert_eq!(
            listed(&names),
            "`1.safetensors`, `2.safetensors`, `3.safetensors`, `4.safetensors` and 2 more"
        );
        // One more is named rather than counted.
        assert_eq!(
            listed(&names[..5]),
            "`1.safetensors`, `2.safetensors`, `3.safetensors`, `4.safetensors`, `5.safetensors`"
        );
    }

    #[test]
    fn a_pipelines_components_are_found_one_level_down() {
        let paths = [
            "model_index.json",
            "vae/diffusion_pytorch_model.safetensors",
            "vae/config.json",
            "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
            "transformer/diffusion_pytorch_model.safetensors.index.json",
            "scheduler/scheduler_config.json",
            "text_encoder/model.safetensors",
            "text_encoder/deeper/model.safetensors",
        ];
        assert_eq!(
            subfolders_with_models(paths),
            ["text_encoder", "transformer", "vae"]
        );
    }

    #[test]
    fn shard_names_are_read_from_the_end() {
        assert_eq!(
            shard_set("a-b-00001-of-00002.safetensors"),
            Some(("a-b", "00002"))
        );
        assert_eq!(shard_set("model-x-of-00002.safetensors"), None);
        assert_eq!(shard_set("model-00001-of-.safetensors"), None);
        assert_eq!(shard_set("model.safetensors"), None);
    }
}
