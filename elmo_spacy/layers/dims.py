"""The thinc dim that counts the ELMo layers per doc.

`n_output_layers` is what the `elmo` pipe puts on `doc._.elmo` per doc: the
token encoding and the L biLSTM layers (L + 1; `BiLMConfig.n_output_layers`),
or the ones its `layers` setting keeps. `BiLMConfig.n_layers` is L.
"""

N_OUTPUT_LAYERS = "n_output_layers"
