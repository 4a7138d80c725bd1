//! What stui knows of each family, keyed by transformers' `model_type`: which config keys the
//! family reads for each size, what its layers mix tokens with. A family that is not listed reads
//! the common keys ([`Family::COMMON`]); a new family is a new row.

/// One family's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    pub model_type: &'static str,
    /// What mixes tokens in every layer when the config does not say per layer.
    pub mixer: &'static str,
    /// Whether its layers have a feed-forward part at all (Mamba's do not).
    pub mlp: bool,
    /// The config keys for the dense feed-forward width, first found wins.
    pub dense_width: &'static [&'static str],
    /// The config keys for one expert's feed-forward width, first found wins.
    pub expert_width: &'static [&'static str],
    /// The query and key norms span all heads (OLMo-2) rather than one head's width.
    pub qk_norm_spans_heads: bool,
    /// Modules that not every layer of a kind has, by design, so not checked for completeness:
    /// T5's relative attention bias (in the first block only), Zamba2's shared transformer
    /// (stored in the first hybrid layer, tied to the others), `ModernBERT`'s attention norm
    /// (none in the first layer).
    pub irregular: &'static [&'static str],
}

impl Family {
    pub const COMMON: Family = Family {
        model_type: "",
        mixer: "attention",
        mlp: true,
        dense_width: &["intermediate_size", "n_inner", "ffn_dim"],
        expert_width: &["moe_intermediate_size", "intermediate_size"],
        qk_norm_spans_heads: false,
        irregular: &[],
    };

    /// The row for `model_type`, or the common one.
    pub fn of(model_type: Option<&str>) -> &'static Family {
        model_type
            .and_then(|name| FAMILIES.iter().find(|family| family.model_type == name))
            .unwrap_or(&Family::COMMON)
    }
}

const fn row(model_type: &'static str) -> Family {
    Family {
        model_type,
        ..Family::COMMON
    }
}

/// The families whose keys or layers differ from the common ones.
pub const FAMILIES: &[Family] = &[
    Family {
        mixer: "mamba",
        mlp: false,
        ..row("mamba")
    },
    Family {
        mixer: "mamba",
        mlp: false,
        ..row("mamba2")
    },
    Family {
        mixer: "attention + mamba",
        ..row("falcon_h1")
    },
    Family {
        qk_norm_spans_heads: true,
        ..row("olmo2")
    },
    Family {
        qk_norm_spans_heads: true,
        ..row("olmoe")
    },
    Family {
        qk_norm_spans_heads: true,
        ..row("olmo3")
    },
    Family {
        irregular: &["layer.0.SelfAttention.relative_attention_bias"],
        ..row("t5")
    },
    Family {
        irregular: &["layer.0.SelfAttention.relative_attention_bias"],
        ..row("mt5")
    },
    Family {
        irregular: &["layer.0.SelfAttention.relative_attention_bias"],
        ..row("longt5")
    },
    Family {
        irregular: &["layer.0.SelfAttention.relative_attention_bias"],
        ..row("switch_transformers")
    },
    Family {
        irregular: &["shared_transformer"],
        ..row("zamba2")
    },
    Family {
        irregular: &["shared_transformer"],
        ..row("zamba")
    },
    Family {
        irregular: &["attn_norm"],
        ..row("modernbert")
    },
    Family {
        // Llama 4: `intermediate_size` is an expert's width, `intermediate_size_mlp` the
        // dense layers'.
        dense_width: &["intermediate_size_mlp"],
        expert_width: &["intermediate_size"],
        ..row("llama4_text")
    },
    Family {
        dense_width: &["intermediate_size_mlp"],
        expert_width: &["intermediate_size"],
        ..row("llama4")
    },
];
