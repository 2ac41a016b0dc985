"""A tiny local stand-in for what NxD's Llama fine-tuning example downloads: databricks-dolly-15k
(its columns ``instruction``, ``context``, ``response``, ``category``, saved as a ``DatasetDict``
with a ``train`` split, which the example reads with ``datasets.load_from_disk``) and the base
model's tokenizer (a word-level ``PreTrainedTokenizerFast`` that ``AutoTokenizer`` loads from a
directory). Run in the example's environment: ``python dolly_stand_in.py DATA_DIR TOKENIZER_DIR``.
"""

import random
import sys

import datasets
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

#: the example's prompt template words, then plain words; ids stay below the tiny model's vocabulary (128)
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
TEMPLATE = ("###", "Instruction", "Context", "Answer")
WORDS = tuple(f"w{i}" for i in range(100))
#: dolly's categories; the example keeps one (``--task``)
CATEGORIES = ("open_qa", "closed_qa", "summarization")


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + " ."


def write(data_dir: str, tokenizer_dir: str, rows: int = 120) -> None:
    rng = random.Random(0)
    columns = {"instruction": [], "context": [], "response": [], "category": []}
    for i in range(rows):
        columns["instruction"].append(sentence(rng, 8))
        columns["context"].append(sentence(rng, 12) if i % 2 else "")  # dolly's open_qa rows often have none
        columns["response"].append(" ".join(sentence(rng, 15) for _ in range(12)))
        columns["category"].append(CATEGORIES[i % len(CATEGORIES)])
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns)}).save_to_disk(data_dir)

    vocab = {token: i for i, token in enumerate((*SPECIAL, *TEMPLATE, ".", *WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Llama's tokenizer gives no token_type_ids
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", model_input_names=["input_ids", "attention_mask"]
                            ).save_pretrained(tokenizer_dir)


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2])
