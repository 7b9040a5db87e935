"""The thinc dim that counts the layers per doc on `doc._.elmo`: L + 1, or
those that the `layers` run setting keeps (`BiLMConfig.n_layers` is L)."""

N_OUTPUT_LAYERS = "n_output_layers"
