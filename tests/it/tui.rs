//! The explorer's screens, drawn on ratatui's test backend after injected actions and scan events.

use crate::support;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::Color;
use std::sync::Arc;
use std::time::Duration;
use stui::analysis::{HistogramBuilder, moments_of, values};
use stui::format::Model;
use stui::jobs::{Progress, ScanEvent};
use stui::tui::action::Action;
use stui::tui::app::App;
use stui::tui::{Theme, ui};

fn demo(colored: bool) -> App {
    // Relative, so that the header (and the snapshots) do not depend on where the repository is.
    let path = std::path::Path::new("assets/demo.safetensors");
    assert!(path.is_file(), "tests run from the repository root");
    App::new(Arc::new(Model::open(path).unwrap()), Theme::new(colored))
}

fn draw(app: &mut App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| ui::render(frame, app)).unwrap();
    terminal
}

fn screen(app: &mut App, width: u16, height: u16) -> String {
    draw(app, width, height).backend().to_string()
}

/// Snapshots the screen at 80x24 and at 120x40.
fn both_sizes(name: &str, app: &mut App) {
    insta::assert_snapshot!(format!("{name}_80x24"), screen(app, 80, 24));
    insta::assert_snapshot!(format!("{name}_120x40"), screen(app, 120, 40));
}

/// Feeds the app what a full scan of the demo reports, with fixed timings.
fn finish_scan(app: &mut App) {
    let model = Arc::clone(&app.model);
    let bytes = std::fs::read(&model.shards[0].path).unwrap();
    for (tensor, entry) in model.tensors.iter().enumerate() {
        let (start, len) = model.file_range(entry);
        let data = &bytes[usize::try_from(start).unwrap()..usize::try_from(start + len).unwrap()];
        let dtype = entry.info.dtype.known().unwrap();
        let moments = moments_of(dtype, data);
        app.on_scan(ScanEvent::Stats { tensor, moments });
        for finding in stui::analysis::checks::tensor_findings(
            entry.name(),
            dtype,
            &moments,
            &stui::analysis::checks::Limits::default(),
        ) {
            app.on_scan(ScanEvent::Finding(finding));
        }
        let mut builder = HistogramBuilder::new(moments.min, moments.max);
        values::feed(dtype, data, &mut builder);
        app.on_scan(ScanEvent::Histogram {
            tensor,
            histogram: builder.finish(),
        });
    }
    app.on_scan(ScanEvent::Done(progress(model.tensors.len(), 2_500_864)));
}

fn progress(done: usize, bytes: u64) -> Progress {
    Progress {
        bytes_done: bytes,
        bytes_total: 2_500_864,
        tensors_done: done,
        tensors_total: 39,
        elapsed: Duration::from_millis(250),
    }
}

#[test]
fn loading_from_the_header_alone() {
    let mut app = demo(true);
    both_sizes("loading", &mut app);
}

#[test]
fn scanning_shows_progress() {
    let mut app = demo(true);
    app.on_scan(ScanEvent::Progress(progress(12, 1_000_000)));
    both_sizes("scanning", &mut app);
}

/// Once the scan is done, the tensors the cursor asks for again (their histograms) leave its
/// summary as it ended: the time was once the time of the last key pressed.
#[test]
fn the_scan_s_summary_keeps_the_time_it_ended_with() {
    let mut app = demo(true);
    finish_scan(&mut app);
    let done = screen(&mut app, 80, 24);
    assert!(
        done.contains("scan done: 39 tensors, 2.39 MiB in 0.2 s"),
        "{done}"
    );
    let mut later = progress(40, 2_600_000);
    later.elapsed = Duration::from_secs(3);
    assert!(!app.on_scan(ScanEvent::Progress(later)));
    assert_eq!(screen(&mut app, 80, 24), done);
}

#[test]
fn nan_is_marked_up_the_tree_and_n_lands_on_it() {
    let mut app = demo(true);
    finish_scan(&mut app);
    app.update(Action::NextProblem);
    let selected = app
        .selected_tensor()
        .map(|t| app.model.tensors[t].name().to_owned());
    assert_eq!(
        selected.as_deref(),
        Some("model.layers.2.mlp.down_proj.weight")
    );
    both_sizes("nan", &mut app);
}

#[test]
fn histogram_views() {
    let mut app = demo(true);
    finish_scan(&mut app);
    // The first row: lm_head.weight.
    both_sizes("histogram_linear", &mut app);
    app.update(Action::ToggleLogHistogram);
    both_sizes("histogram_log", &mut app);
}

#[test]
fn search_filters_the_tree() {
    let mut app = demo(true);
    app.update(Action::StartSearch);
    for c in "o_proj".chars() {
        app.update(Action::SearchType(c));
    }
    both_sizes("search", &mut app);
}

#[test]
fn help_and_metadata_popups() {
    let mut app = demo(true);
    app.update(Action::ShowHelp);
    both_sizes("help", &mut app);
    app.update(Action::ClosePopup);
    app.update(Action::ShowMetadata);
    both_sizes("metadata", &mut app);
}

/// At 80 columns the structural id and the architecture are shown whole, a long value (an adapter
/// trainer's tag list) over three lines that end in "…", and the entries left out are counted.
#[test]
fn metadata_at_80_columns_shows_the_identity_whole_and_long_values_wrapped() {
    use stui::format::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lora.safetensors");
    let tags: Vec<String> = (0..200).map(|i| format!("\"tag{i}\": {i}")).collect();
    let mut model = stui::demo::SyntheticModel::new(0)
        .tensor("w", Dtype::F32, &[1, 1], stui::demo::Fill::Zeros)
        .metadata("ss_tag_frequency", &format!("{{{}}}", tags.join(", ")));
    for i in 0..30 {
        model = model.metadata(&format!("ss_training_{i:02}"), "x");
    }
    model.write(&path).unwrap();
    let mut app = App::new(Arc::new(Model::open(&path).unwrap()), Theme::new(false));
    app.update(Action::ShowMetadata);
    let shown = screen(&mut app, 80, 24);
    let id = &app.identity().structural_id;
    assert!(shown.contains(id.as_str()), "{shown}");
    let rows: Vec<&str> = shown
        .lines()
        .filter(|l| l.contains("ss_tag_frequency") || l.contains("\"tag"))
        .collect();
    assert_eq!(rows.len(), 3, "{shown}");
    assert!(rows[2].contains(" …"), "{shown}");
    let listed = shown.matches("ss_training_").count();
    assert!(listed > 5, "{shown}");
    assert!(
        shown.contains(&format!("… {} more entries", 30 - listed)),
        "{shown}"
    );
}

/// In the layer map, the help lists the map's own keys and those that work everywhere, so that
/// it fits 80x24 without cutting a label.
#[test]
fn help_in_the_layer_map() {
    let mut app = demo(true);
    app.update(Action::ToggleMap);
    app.update(Action::ShowHelp);
    both_sizes("help_in_map", &mut app);
    let screen = draw(&mut app, 80, 24).backend().to_string();
    for label in [
        "layer map",
        "measure",
        "go to tensor",
        "everywhere",
        "wheel scrolls, click selects",
    ] {
        assert!(screen.contains(label), "`{label}` missing:\n{screen}");
    }
    assert!(
        !screen.contains("half page up"),
        "the tree's keys are listed in the map:\n{screen}"
    );
}

/// Each heading of the help popup starts in the column of the keys listed under it, in either
/// column of the popup, and no label is cut.
#[test]
fn help_headings_line_up_with_their_keys() {
    let mut app = demo(true);
    app.update(Action::ShowHelp);
    for (width, height) in [(80, 24), (120, 40)] {
        let terminal = draw(&mut app, width, height);
        let buffer = terminal.backend().buffer();
        let text = |x: u16, y: u16| buffer[(x, y)].symbol().to_owned();
        // Headings are bold and uncoloured; keys are coloured; labels are plain.
        let is_key = |x: u16, y: u16| buffer[(x, y)].fg == Color::Cyan && text(x, y) != " ";
        let is_heading = |x: u16, y: u16| {
            let cell = &buffer[(x, y)];
            cell.modifier.contains(ratatui::style::Modifier::BOLD)
                && cell.fg != Color::Cyan
                && text(x, y) != " "
        };
        let (top, left) = (0..height)
            .flat_map(|y| (0..width - 5).map(move |x| (y, x)))
            .find(|&(y, x)| (x..x + 6).map(|x| text(x, y)).collect::<String>() == "┌ keys")
            .unwrap();
        let right = (left + 1..width).find(|&x| text(x, top) == "┐").unwrap();
        let mut headings = Vec::new();
        for y in top + 1..height - 1 {
            for x in left + 1..right {
                if is_heading(x, y) && !is_heading(x - 1, y) {
                    let word: String = (x..right)
                        .take_while(|&x| is_heading(x, y))
                        .map(|x| text(x, y))
                        .collect();
                    assert!(
                        is_key(x, y + 1) && !is_key(x - 1, y + 1),
                        "{width}x{height}: `{word}` at column {x} is not over its keys"
                    );
                    headings.push(word);
                }
            }
        }
        assert_eq!(headings, ["tree", "findings", "search", "everywhere"]);
        let screen = terminal.backend().to_string();
        assert!(screen.contains("wheel scrolls, click selects"), "{screen}");
    }
}

#[test]
fn an_unreadable_file_gets_an_error_screen() {
    let dir = tempfile::tempdir().unwrap();
    let path = support::write(
        dir.path(),
        "model.safetensors",
        b"version https://git-lfs.github.com/spec/v1\nsize 100\n",
    );
    let mut app = App::new(Arc::new(Model::open(&path).unwrap()), Theme::new(true));
    let text = screen(&mut app, 80, 24);
    assert!(text.contains("cannot be read"), "{text}");
    assert!(text.contains("Git LFS pointer"), "{text}");
    // The header line holds the temporary path; the snapshot keeps the rest of the screen.
    let body: Vec<&str> = text.lines().skip(1).collect();
    insta::assert_snapshot!("unreadable", body.join("\n"));
}

#[test]
fn no_color_uses_no_colour_at_all() {
    let mut app = demo(false);
    finish_scan(&mut app);
    app.update(Action::NextProblem);
    let terminal = draw(&mut app, 80, 24);
    let buffer = terminal.backend().buffer();
    for cell in buffer.content() {
        assert!(
            cell.fg == Color::Reset && cell.bg == Color::Reset,
            "a coloured cell: {cell:?}"
        );
    }
    let text = terminal.backend().to_string();
    assert!(text.contains('✖'), "marks show by symbol without colour");
    insta::assert_snapshot!("no_color", text);
}

#[test]
fn tiny_terminals_do_not_panic() {
    let mut app = demo(true);
    for (width, height) in [(0, 0), (1, 1), (19, 7), (20, 8), (40, 10)] {
        draw(&mut app, width, height);
    }
}

#[test]
fn findings_enter_jumps_to_the_tensor() {
    let mut app = demo(true);
    finish_scan(&mut app);
    app.update(Action::FocusNext);
    app.update(Action::Last);
    app.update(Action::JumpToFinding);
    let selected = app
        .selected_tensor()
        .map(|t| app.model.tensors[t].name().to_owned());
    assert_eq!(
        selected.as_deref(),
        Some("model.layers.3.self_attn.o_proj.weight")
    );
}

/// At 80 columns most findings are cut; the one selected is shown whole, however long, and the
/// list scrolls so that all of it is on screen.
#[test]
fn the_finding_selected_is_read_whole_at_80_columns() {
    let mut app = demo(false);
    finish_scan(&mut app);
    let message =
        "values-all-zero model.layers.3.self_attn.o_proj.weight: all 16384 values are zero";
    let flat = |screen: &str| -> String {
        screen
            .lines()
            .map(|line| line.trim_matches(|c| c == '"' || c == '│').trim_end())
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(!flat(&screen(&mut app, 80, 24)).contains(message));
    app.update(Action::FocusNext);
    app.update(Action::Last);
    let shown = screen(&mut app, 80, 24);
    assert!(flat(&shown).contains(message), "{shown}");
    insta::assert_snapshot!("finding_selected_whole_80x24", shown);
    // Moving on, the finding before it is whole and the one left is cut again.
    app.update(Action::Up);
    let shown = flat(&screen(&mut app, 80, 24));
    assert!(!shown.contains(message), "{shown}");
    assert!(
        shown.contains("1 +Inf and 1 -Inf among 44032 values"),
        "{shown}"
    );
}

/// A finding taller than the pane would not be drawn at all: its start fills the pane and ends
/// in "…".
#[test]
fn a_finding_taller_than_the_pane_shows_its_start() {
    use stui::finding::{Code, Finding};
    let mut app = demo(false);
    let words: Vec<String> = (0..200).map(|i| format!("word{i}")).collect();
    let message = words.join(" ");
    app.on_scan(ScanEvent::Finding(Finding::info(
        Code::TensorOrder,
        message,
    )));
    app.update(Action::FocusNext);
    let shown = screen(&mut app, 80, 24);
    let pane: Vec<&str> = shown
        .lines()
        .skip_while(|line| !line.contains("findings ·"))
        .skip(1)
        .take(4)
        .collect();
    assert!(pane[0].contains("tensor-order word0 word1"), "{shown}");
    assert!(pane[3].contains(" …"), "{shown}");
}

#[test]
fn a_flood_of_findings_is_listed_up_to_a_bound_and_says_what_it_leaves_out() {
    use stui::finding::{Code, Finding};
    use stui::tui::app::FindingList;
    let mut app = demo(false);
    let flood = FindingList::LISTED + 25;
    for i in 0..flood {
        let finding = Finding::info(Code::TensorOrder, format!("finding {i}"));
        app.on_scan(ScanEvent::Finding(finding));
    }
    let text = screen(&mut app, 80, 24);
    assert!(text.contains("10025 (all, 10000 listed)"), "{text}");
    app.update(Action::FocusNext);
    app.update(Action::Last);
    let text = screen(&mut app, 80, 24);
    assert!(text.contains("finding 9999"), "{text}");
    assert!(text.contains("25 more not listed"), "{text}");
}

/// A scope holding no weight a scheme would quantize (the demo opens on `lm_head.weight`, which
/// every scheme keeps) says why and where to go, and shows dashes in the comparison, not zero
/// bits and infinite SNRs.
#[test]
fn a_scope_without_weights_compares_as_dashes() {
    use stui::quantize::Granularity;
    use stui::tui::app::Effect;
    let mut app = demo(true);
    let (_, effect) = app.update(Action::Quantize);
    let Some(Effect::Preview(chosen, Granularity::PerChannel, _, Some((compare, _)))) = effect
    else {
        panic!("a preview and a comparison of the tensor selected")
    };
    assert!(chosen.is_empty());
    let comparison =
        stui::quantize::compare(&app.model, &compare, &stui::quantize::Control::default())
            .map_err(|e| e.to_string());
    assert!(app.on_compared(&compare.include, comparison));
    let shown = screen(&mut app, 100, 40);
    let row = shown
        .lines()
        .find(|line| line.contains("W4A16_ASYM"))
        .unwrap_or_default();
    assert_eq!(row.matches('–').count(), 3, "{shown}");
    assert!(!shown.contains("inf"), "{shown}");
    assert!(
        shown.contains(
            "nothing to quantize in tensor lm_head.weight (kept: lm-head); w: the whole model"
        ),
        "{shown}"
    );
    let narrow = screen(&mut app, 80, 24);
    let said = wrapped_in_dialog(&narrow, "nothing to quantize");
    assert!(
        said.ends_with("(kept: lm-head); w: the whole model"),
        "{narrow}"
    );
    app.update(Action::QuantizeWholeModel);
    let whole = screen(&mut app, 100, 40);
    assert!(!whole.contains("nothing to quantize"), "{whole}");
    assert!(whole.contains("28 tensors chosen"), "{whole}");
}

/// At 80x24 the names give way to the figures: the worst tensors' names are cut to their
/// layer and their end, and the weights kept for their SNR are still marked.
fn the_narrow_dialog_keeps_its_figures(app: &mut App) {
    let narrow = screen(app, 80, 24);
    insta::assert_snapshot!("quantize_preview_80x24", narrow);
    assert!(narrow.contains("layers.3.…_attn.k_proj"), "{narrow}");
    assert!(
        narrow
            .contains("model.layers.3.self_attn.k_proj.weight    19.32    6.836e-3  1.081e-1 kept"),
        "{narrow}"
    );
}

/// Enter in the quantize dialog, and the save it asks for run to `output` and reported back.
fn confirm_and_save(app: &mut App, output: &std::path::Path) {
    use stui::tui::app::Effect;
    let (_, effect) = app.update(Action::QuantizeConfirm);
    let Some(Effect::Save(options, _, control)) = effect else {
        panic!("a save")
    };
    let result =
        stui::quantize::quantize(&app.model, output, &options, &control).map_err(|e| e.to_string());
    app.on_saved(result);
}

/// The two lines of a dialog's message that starts with `start`, wrapped on `shown`, joined
/// without the dialog's borders.
fn wrapped_in_dialog(shown: &str, start: &str) -> String {
    shown
        .lines()
        .map(|line| line.trim_matches(|c| "\"│┌┐└┘─ ".contains(c)))
        .skip_while(|line| !line.starts_with(start))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A save stopped by NaN says why and what to do, whole, on an 80-column screen, and writes
/// nothing.
fn a_save_stopped_by_nan_says_why_in_80_columns(app: &mut App) {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("demo.int8.safetensors");
    confirm_and_save(app, &output);
    let narrow = screen(app, 80, 24);
    let message = wrapped_in_dialog(&narrow, "not saved:");
    assert!(
        message.contains("holds NaN or Inf") && message.ends_with("(skip such tensors to go on)"),
        "{narrow}"
    );
    assert!(!output.exists());
}

#[test]
fn the_quantize_dialog_previews_saves_and_reports() {
    use stui::quantize::{Granularity, Scheme};
    use stui::tui::app::{Effect, Stage};
    let mut app = demo(true);
    let (_, effect) = app.update(Action::Quantize);
    assert!(matches!(effect, Some(Effect::Preview(..))));
    let (_, effect) = app.update(Action::QuantizeWholeModel);
    let Some(Effect::Preview(chosen, Granularity::PerChannel, _, Some((compare, _)))) = effect
    else {
        panic!("a preview and a comparison of the whole model")
    };
    assert_eq!(chosen.len(), 28);
    let nan = app
        .model
        .tensors
        .iter()
        .position(|t| t.name() == "model.layers.2.mlp.down_proj.weight")
        .unwrap();
    for &tensor in &chosen {
        let result = if tensor == nan {
            Ok(None)
        } else {
            stui::quantize::preview(&app.model, tensor, Granularity::PerChannel)
                .map_err(|e| e.to_string())
        };
        app.on_preview(tensor, Granularity::PerChannel, result);
    }
    let comparison =
        stui::quantize::compare(&app.model, &compare, &stui::quantize::Control::default())
            .map_err(|e| e.to_string());
    assert!(app.on_compared(&compare.include, comparison));
    insta::assert_snapshot!("quantize_preview", screen(&mut app, 100, 40));
    // S: the next scheme, its preview from the comparison; k: a threshold, weights below marked.
    app.update(Action::QuantizeScheme);
    for _ in 0..3 {
        app.update(Action::QuantizeKeepBelow);
    }
    let shown = screen(&mut app, 100, 40);
    assert!(
        shown.contains("W8A16 (S)   keep below SNR: 30 dB (k)"),
        "{shown}"
    );
    assert!(shown.contains("▸ W8A16"), "{shown}");
    assert!(!shown.contains("comparing"), "{shown}");
    // The scheme's own scales, and W8A8's that `g` chooses.
    assert!(
        shown.contains("scales  groups of 128 · W8A8 per channel (g)   NaN/Inf tensors: stop (s)"),
        "{shown}"
    );
    // The output, still named after the scheme, follows it.
    assert!(
        shown.contains("output  assets/demo.w8a16.safetensors"),
        "{shown}"
    );
    // The codes' size follows the scheme (half the int8 one for W4A16), over the weights it
    // quantizes: the four `down_proj`s' 344 columns are not in whole groups of 128.
    assert!(
        shown.contains("28 tensors chosen, W8A16 quantizes 24: 1.05 MiB -> 536 KiB (plus scales)"),
        "{shown}"
    );
    app.update(Action::QuantizeScheme);
    let shown = screen(&mut app, 100, 40);
    assert!(
        shown.contains("28 tensors chosen, W4A16 quantizes 24: 1.05 MiB -> 268 KiB (plus scales)"),
        "{shown}"
    );
    let tall = screen(&mut app, 100, 60);
    let kept = tall
        .lines()
        .filter(|line| {
            line.contains("mlp.down_proj.weight") && line.contains("kept: not in whole groups")
        })
        .count();
    assert_eq!(kept, 4, "{tall}");
    the_narrow_dialog_keeps_its_figures(&mut app);
    for _ in 0..Scheme::ALL.len() - 2 {
        app.update(Action::QuantizeScheme);
    }
    for _ in 0..3 {
        app.update(Action::QuantizeKeepBelow);
    }
    assert_eq!(app.quantize.as_ref().unwrap().scheme, Scheme::W8A8);
    assert_eq!(app.quantize.as_ref().unwrap().keep_below_snr, None);
    assert!(
        app.quantize
            .as_ref()
            .unwrap()
            .output
            .ends_with("demo.int8.safetensors")
    );
    a_save_stopped_by_nan_says_why_in_80_columns(&mut app);
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("demo.int8.safetensors");
    app.update(Action::QuantizeSkipNonFinite);
    confirm_and_save(&mut app, &output);
    let dialog = app.quantize.as_ref().unwrap();
    let Stage::Saved(summary) = &dialog.stage else {
        panic!("saved")
    };
    assert!(summary.verified);
    assert_eq!(summary.quantized.len(), 27);
    let (_, effect) = app.update(Action::OpenResult);
    assert!(matches!(effect, Some(Effect::Reopen(path)) if path == output));
}

/// The comparison shows how far it has come, and the work a dialog started in the background
/// stops when the dialog starts it again or closes: a model's weights are not read for nothing.
#[test]
fn the_dialog_s_background_work_shows_its_progress_and_stops_with_it() {
    use std::sync::atomic::Ordering;
    use stui::tui::app::Effect;
    let mut app = demo(true);
    let (_, effect) = app.update(Action::Quantize);
    let Some(Effect::Preview(_, _, first_previews, Some((_, first_comparison)))) = effect else {
        panic!("previews and a comparison")
    };
    first_comparison
        .bytes_total
        .store(3 << 20, Ordering::Relaxed);
    first_comparison
        .bytes_done
        .store(1 << 20, Ordering::Relaxed);
    let shown = screen(&mut app, 80, 24);
    assert!(
        shown.contains("comparing the schemes… 1.00 MiB of 3.00 MiB"),
        "{shown}"
    );
    // `g`: the previews again, the comparison goes on.
    let (_, effect) = app.update(Action::QuantizeGranularity);
    let Some(Effect::Preview(_, _, previews, None)) = effect else {
        panic!("previews alone")
    };
    assert!(first_previews.cancelled.load(Ordering::Relaxed));
    assert!(!first_comparison.cancelled.load(Ordering::Relaxed));
    // `w`: another scope, compared again.
    let (_, effect) = app.update(Action::QuantizeWholeModel);
    let Some(Effect::Preview(_, _, _, Some((_, comparison)))) = effect else {
        panic!("a comparison of the whole model")
    };
    assert!(previews.cancelled.load(Ordering::Relaxed));
    assert!(first_comparison.cancelled.load(Ordering::Relaxed));
    assert!(!comparison.cancelled.load(Ordering::Relaxed));
    app.update(Action::QuantizeCancel);
    assert!(app.quantize.is_none());
    assert!(comparison.cancelled.load(Ordering::Relaxed));
}

/// With more tensors chosen than are previewed, the first are previewed and the dialog says so;
/// the rows shown are the worst of those previewed, then the first not previewed yet.
#[test]
fn the_quantize_dialog_previews_the_first_of_many() {
    use stui::format::Dtype;
    use stui::quantize::Error8;
    use stui::tui::app::{Effect, QuantizeDialog};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.safetensors");
    let count = QuantizeDialog::PREVIEWED + 5;
    let mut model = stui::demo::SyntheticModel::new(0);
    for layer in 0..count {
        model = model.tensor(
            &format!("l.{layer}.weight"),
            Dtype::F32,
            &[1, 1],
            stui::demo::Fill::Zeros,
        );
    }
    model.write(&path).unwrap();
    let mut app = App::new(Arc::new(Model::open(&path).unwrap()), Theme::new(false));
    let (_, effect) = app.update(Action::Quantize);
    let Some(Effect::Preview(previewed, granularity, ..)) = effect else {
        panic!("a preview")
    };
    assert_eq!(previewed.len(), QuantizeDialog::PREVIEWED);
    let worst = previewed[7];
    let error = |snr_db| {
        Ok(Some(Error8 {
            snr_db,
            ..Error8::default()
        }))
    };
    app.on_preview(previewed[3], granularity, error(40.0));
    app.on_preview(worst, granularity, error(12.5));
    let shown = screen(&mut app, 100, 30);
    assert!(shown.contains("previews of the first 10000"), "{shown}");
    let rows: Vec<&str> = shown
        .lines()
        .skip_while(|line| !line.contains("PREVIEW (worst first)"))
        .skip(1)
        .take(3)
        .collect();
    let name = |tensor: usize| app.model.tensors[tensor].name().to_owned();
    assert!(rows[0].contains(&format!("{} ", name(worst))), "{rows:?}");
    assert!(
        rows[1].contains(&format!("{} ", name(previewed[3]))),
        "{rows:?}"
    );
    assert!(rows[2].contains('…'), "{rows:?}");
}

#[test]
fn a_diff_marks_changed_tensors_up_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let mut other = stui::demo::demo_model();
    other.tensors.retain(|t| t.spec.name != "lm_head.weight");
    let other = other.plant("model.layers.1.self_attn.q_proj.weight", 0, 3.0);
    let other_path = dir.path().join("other.safetensors");
    other.write(&other_path).unwrap();
    let mut app = demo(true);
    finish_scan(&mut app);
    let diff = support::stored_diff(&app.model, &other_path);
    assert!(app.on_diff(&diff));
    let view = app.diff.as_ref().unwrap();
    let root = view.marks[stui::tree::ROOT as usize];
    assert_eq!((root.changed, root.only_here), (1, 1));
    assert_eq!((view.changed, view.only_here, view.only_there), (1, 1, 0));
    app.update(Action::ExpandAll);
    let wanted = "model.layers.1.self_attn.q_proj.weight";
    for _ in 0..200 {
        if app
            .selected_tensor()
            .is_some_and(|t| app.model.tensors[t].name() == wanted)
        {
            break;
        }
        app.update(Action::Down);
    }
    both_sizes("diff", &mut app);
}

#[test]
fn a_file_truncated_during_the_scan_shows_findings_and_marks_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.safetensors");
    std::fs::copy(support::demo_path(), &path).unwrap();
    let model = Arc::new(Model::open(&path).unwrap());
    let mut app = App::new(Arc::clone(&model), Theme::new(false));
    let (sender, receiver) = std::sync::mpsc::sync_channel(1 << 16);
    let everything = 0..model.tensors.len();
    let options = stui::jobs::ScanOptions {
        paused: true,
        ..stui::jobs::ScanOptions::default()
    };
    let scan = stui::jobs::Scan::start(Arc::clone(&model), everything, options, sender);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(model.shards[0].file_len / 2)
        .unwrap();
    scan.set_paused(false);
    for event in receiver {
        let last = matches!(event, ScanEvent::Done(_) | ScanEvent::Cancelled);
        app.on_scan(event);
        if last {
            break;
        }
    }
    let screen = screen(&mut app, 120, 40);
    assert!(
        screen.contains("data-unreadable") && screen.contains("the file ends before this tensor"),
        "the findings say what happened:\n{screen}"
    );
    assert!(
        screen
            .lines()
            .any(|l| l.contains('✖') && l.contains("model")),
        "the unreadable tensors are marked up the tree:\n{screen}"
    );
}

/// A header with thousands of metadata entries shows those that fit and counts the rest.
#[test]
fn a_long_metadata_popup_shows_what_fits() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = support::small_model();
    for key in 0..5000 {
        model = model.metadata(&format!("key{key:04}"), "value");
    }
    let path = dir.path().join("many.safetensors");
    model.write(&path).unwrap();
    let mut app = App::new(Arc::new(Model::open(&path).unwrap()), Theme::new(false));
    app.update(Action::ShowMetadata);
    let text = screen(&mut app, 80, 24);
    assert!(text.contains("key0000 = value"), "{text}");
    assert!(text.contains("more entries"), "{text}");
    assert!(!text.contains("key4999"), "{text}");
}

#[test]
fn the_header_names_the_model_and_the_layers_show_their_pattern() {
    let dir = support::rebuild_fixture("deepseek_v3", &mut |_, _| {});
    let (model, _) = stui::arch::open_reviewed(dir.path(), None).unwrap();
    let mut app = App::new(Arc::new(model), Theme::new(false));
    for _ in 0..20 {
        let path = app.selected_node().map(|node| app.tree.path(node));
        match path.as_deref() {
            Some("model.layers") => break,
            Some("model") => app.update(Action::Expand),
            _ => app.update(Action::Down),
        };
    }
    let text = screen(&mut app, 120, 40);
    assert!(text.contains("valid  deepseek_v3  "), "{text}");
    assert!(text.contains("layer pattern (config)"), "{text}");
    for run in ["0: dense MLP", "1-3: MoE, 4 experts + 1 shared"] {
        assert!(text.contains(run), "{run}: {text}");
    }
}

/// A tensor of a model read from the Hub whose bytes pass `--fetch-limit` says it is not
/// fetched, and why, in both panes, rather than that its statistics are on their way; one within
/// the limit waits for them.
#[test]
fn a_tensor_past_the_fetch_limit_says_it_is_not_fetched() {
    let mut app = demo(false);
    let large = (0..app.model.tensors.len())
        .max_by_key(|&t| app.model.tensors[t].info.byte_len())
        .unwrap();
    let small = (0..app.model.tensors.len())
        .min_by_key(|&t| app.model.tensors[t].info.byte_len())
        .unwrap();
    app.fetch_limit = Some(app.model.tensors[small].info.byte_len());
    app.select_tensor(large);
    let shown = screen(&mut app, 120, 40);
    assert!(
        shown.contains("not fetched: ") && shown.contains("more than --fetch-limit"),
        "{shown}"
    );
    assert!(!shown.contains("computing…"), "{shown}");
    app.select_tensor(small);
    let shown = screen(&mut app, 120, 40);
    assert!(!shown.contains("not fetched"), "{shown}");
    assert!(
        shown.contains("statistics pending") && shown.contains("computing…"),
        "{shown}"
    );
}

/// `Q` on a model read from the Hub opens no dialog: it says what to do, since quantizing reads
/// every tensor.
#[test]
fn quantize_on_a_model_from_the_hub_says_to_download_it() {
    let mut model = Model::open(std::path::Path::new("assets/demo.safetensors")).unwrap();
    model.remote = Some(Arc::new(stui::format::remote::RemoteModel {
        hub: Arc::new(stui::source::hub::Hub::new(
            "http://127.0.0.1:9".into(),
            None,
        )),
        repo: stui::source::RepoRef {
            id: "org/demo".into(),
            revision: None,
            path: None,
            remote: true,
        },
        commit: "abcdefabcdefabcdefabcdefabcdefabcdefabcd".into(),
        files: vec!["model.safetensors".into()],
        blobs: vec![None],
        config: None,
        side_files: Vec::new(),
        cache: None,
        prefetched: std::collections::HashMap::new(),
    }));
    let mut app = App::new(Arc::new(model), Theme::new(false));
    app.update(Action::Quantize);
    assert!(app.quantize.is_none());
    let shown = screen(&mut app, 100, 30);
    assert!(
        shown.contains("quantize reads every tensor: download it first (`hf download org/demo`)"),
        "{shown}"
    );
}

/// The layer map of a model read from the Hub, which has no background scan, says how its cells
/// fill rather than that nothing stands out.
#[test]
fn the_layer_map_of_a_model_from_the_hub_says_how_its_cells_fill() {
    let mut app = demo(false);
    app.fetch_limit = Some(512 << 20);
    app.update(Action::ToggleMap);
    let shown = screen(&mut app, 80, 24);
    assert!(
        shown.contains("a model on the Hub is read a tensor at a time: Enter on a cell fetches it")
            && shown.contains("`stui stats --map` fetches them all"),
        "{shown}"
    );
    assert!(!shown.contains("nothing stands out"), "{shown}");
}
