//! The explorer on a quantized checkpoint written by compressed-tensors: one row per logical
//! weight, its scheme and members in the details, its statistics those of the dequantized
//! weight (worked out here from the producer's own dequantization), a scale broken in the file
//! an error on the weight, and `R` listing the stored tensors.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use std::path::Path;
use std::sync::Arc;
use stui::format::Model;
use stui::jobs::{Scan, ScanEvent, ScanOptions};
use stui::quant::{LogicalModel, Quantization};
use stui::tui::action::Action;
use stui::tui::app::{App, Effect, Outcome};
use stui::tui::{Theme, ui};

const FOLDER: &str = "tests/fixtures/quant/ct-w4a16";
const WEIGHT: &str = "model.layers.0.self_attn.q_proj.weight";

/// The explorer's app on the model at `path`, listed by its logical weights, scanned to the end
/// by a real scan over the dequantized weights.
fn scanned(path: &Path) -> App {
    let model = Arc::new(Model::open(path).unwrap());
    let quantization = Arc::new(stui::arch::quantization(&model).unwrap());
    let (listed, logical) = LogicalModel::open(Arc::clone(&model), Arc::clone(&quantization));
    let (listed, logical) = (Arc::new(listed), Arc::new(logical));
    let mut app = App::new(Arc::clone(&listed), Theme::new(false));
    app.set_quantization(Some(quantization), Some(Arc::clone(&logical)));
    let (sender, events) = std::sync::mpsc::sync_channel(64);
    let options = ScanOptions {
        logical: Some(logical),
        histograms: true,
        ..ScanOptions::default()
    };
    let scan = Scan::start(listed, 0..app.model.tensors.len(), options, sender);
    for mut event in events {
        let done = matches!(event, ScanEvent::Done(_) | ScanEvent::Cancelled);
        // A fixed time taken, for the snapshots.
        if let ScanEvent::Done(progress) = &mut event {
            progress.elapsed = std::time::Duration::from_millis(100);
        }
        app.on_scan(event);
        if done {
            break;
        }
    }
    scan.wait();
    app
}

fn select(app: &mut App, name: &str) -> usize {
    let tensor = (0..app.model.tensors.len())
        .find(|&t| app.model.tensors[t].name() == name)
        .unwrap_or_else(|| panic!("{name} is not listed"));
    app.select_tensor(tensor);
    tensor
}

fn screen(app: &mut App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| ui::render(frame, app)).unwrap();
    terminal.backend().to_string()
}

/// The producer's dequantized values of `name`.
fn reference(name: &str) -> Vec<f32> {
    crate::support::float_tensors(&Path::new(FOLDER).join("reference.safetensors"))
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} has no reference"))
        .1
}

#[test]
fn a_quantized_model_is_listed_by_its_weights_with_their_dequantized_statistics() {
    let mut app = scanned(Path::new(FOLDER));
    let names: Vec<&str> = app
        .model
        .tensors
        .iter()
        .map(stui::format::Tensor::name)
        .collect();
    assert!(names.contains(&WEIGHT), "{names:?}");
    assert!(
        !names.iter().any(|n| n.ends_with("weight_packed")
            || n.ends_with("weight_scale")
            || n.ends_with("weight_shape")),
        "members are not listed: {names:?}"
    );
    // A tensor that is no logical weight is no member either.
    for tensor in 0..app.model.tensors.len() {
        if app.logical_weight(tensor).is_none() {
            app.select_tensor(tensor);
            let text = screen(&mut app, 120, 40);
            assert!(!text.contains("member of"), "{text}");
        }
    }
    let tensor = select(&mut app, WEIGHT);
    let values = reference(WEIGHT);
    let Some(Outcome::Moments(moments)) = app.outcomes.get(tensor) else {
        panic!("{WEIGHT} was not scanned");
    };
    let min = values.iter().copied().fold(f32::INFINITY, f32::min);
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    assert_eq!((moments.min, moments.max), (f64::from(min), f64::from(max)));
    assert_eq!(moments.count, values.len() as u64);
    assert!(app.histograms.contains_key(&tensor));
    let text = screen(&mut app, 120, 40);
    assert!(text.contains("int4 g128"), "{text}");
    assert!(text.contains("min -8.154"), "{text}");
    let tall = screen(&mut app, 200, 60);
    assert!(tall.contains("codes: 16 of 16 levels used · "), "{tall}");
    assert!(
        tall.contains("members: weight_packed I32 [128, 16] · weight_shape I64 [2] · weight_scale"),
        "{tall}"
    );
    assert!(text.contains("int4 (compressed-tensors)"), "{text}");
    insta::assert_snapshot!("quantized_weight_120x40", text);
    insta::assert_snapshot!("quantized_weight_80x24", screen(&mut app, 80, 24));
    app.update(Action::ShowHelp);
    assert!(screen(&mut app, 120, 40).contains("stored / logical"));
    app.update(Action::ClosePopup);
    // The stored tensors are one key away.
    assert!(matches!(
        app.update(Action::ToggleRaw).1,
        Some(Effect::ToggleRaw)
    ));
    // Its codes are not quantized again, listed as weights or as stored: the dialog does not
    // open, and the status line says why.
    assert!(app.update(Action::Quantize).1.is_none());
    assert!(app.quantize.is_none());
    let notice = app.notice.clone().unwrap();
    assert!(
        notice.contains("already quantized (int4 g128") && notice.ends_with("source model"),
        "{notice}"
    );
    // Whole on an 80-column screen.
    let narrow = screen(&mut app, 80, 24);
    assert!(narrow.contains(&notice), "{narrow}");
}

#[test]
fn a_weight_opens_onto_its_stored_members() {
    let mut app = scanned(Path::new(FOLDER));
    let tensor = select(&mut app, WEIGHT);
    let closed = screen(&mut app, 120, 40);
    assert!(closed.contains("▸ q_proj.weight"), "{closed}");
    assert!(!closed.contains("weight_packed"), "{closed}");
    app.update(Action::Expand);
    let open = screen(&mut app, 120, 40);
    assert!(open.contains("▾ q_proj.weight"), "{open}");
    let rows: Vec<&str> = open
        .lines()
        .filter(|line| {
            line.contains("weight_packed")
                || line.contains("weight_scale")
                || line.contains("weight_shape")
        })
        .collect();
    assert_eq!(rows.len(), 3, "one row a member: {open}");
    app.update(Action::Expand);
    assert_eq!(
        app.selected_tensor(),
        Some(tensor),
        "a member stands for its weight"
    );
    let member = screen(&mut app, 120, 40);
    let packed = format!("{WEIGHT}_packed");
    assert!(
        member.contains(&packed),
        "the member's stored name: {member}"
    );
    assert!(member.contains("I32 [128, 16]"), "{member}");
    assert!(
        member.contains("member of model.layers.0.self_attn.q_proj.weight"),
        "{member}"
    );
    insta::assert_snapshot!("quantized_member_120x40", member);
    app.update(Action::Collapse);
    assert_eq!(app.outline.selected_member(), None);
    assert_eq!(app.selected_tensor(), Some(tensor));
}

#[test]
fn a_zero_scale_in_the_file_is_an_error_on_the_weight_that_climbs_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
    ] {
        std::fs::copy(Path::new(FOLDER).join(file), dir.path().join(file)).unwrap();
    }
    // The first row's scale of q_proj set to zero, in the file as the producer wrote it.
    let path = dir.path().join("model.safetensors");
    let model = Model::open(&path).unwrap();
    let scale = model
        .tensors
        .iter()
        .find(|t| t.name() == "model.layers.0.self_attn.q_proj.weight_scale")
        .unwrap();
    let (start, _) = model.file_range(scale);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = usize::try_from(start).unwrap();
    bytes[at..at + 2].copy_from_slice(&[0, 0]);
    std::fs::write(&path, bytes).unwrap();
    let mut app = scanned(dir.path());
    let tensor = select(&mut app, WEIGHT);
    let node = app.tree.node_of_tensor(tensor).unwrap();
    assert_eq!(app.marks(node).errors, 1);
    assert_eq!(app.marks(stui::tree::ROOT).errors, 1);
    let finding = app
        .findings
        .iter(None)
        .find(|f| f.tensor.as_deref() == Some(WEIGHT))
        .unwrap();
    assert!(finding.message.contains("zero"), "{}", finding.message);
    assert!(finding.message.contains("rows 0..1"), "{}", finding.message);
    app.update(Action::ExpandAll);
    let text = screen(&mut app, 120, 40);
    assert!(text.contains("quant-scale"), "{text}");
}

#[test]
fn a_plain_model_says_r_has_nothing_to_switch() {
    let model = Arc::new(Model::open(Path::new("assets/demo.safetensors")).unwrap());
    let mut app = App::new(model, Theme::new(false));
    app.set_quantization(None::<Arc<Quantization>>, None);
    assert!(app.update(Action::ToggleRaw).1.is_none());
    assert!(app.notice.as_deref().unwrap().contains("not quantized"));
}
