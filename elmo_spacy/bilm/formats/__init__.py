"""biLMs on disk: this package's directory (`config.json`, `vocab.json`,
`weights.safetensors`), bilm-tf's format (the published ELMo models, AllenNLP's
and NLPL's) in and out, ELMoForManyLangs' folders, and finding which a path
holds (`locate`)."""
