"""biLMs on disk: this package's directory (`config.json`, `vocab.json`,
`weights.safetensors`), bilm-tf's format (the published ELMo models, AllenNLP's
and NLPL's) in and out, ELMoForManyLangs' folders, and the table of them that
`load_bilm` reads any of them by (`locate`)."""
