from algorithms.grpo import GRPOConfig
from benchmarks.api import train
from tasks.pizza import PizzaTask

# Any transformers causal LM and its tokenizer (AutoModelForCausalLM / AutoTokenizer.from_pretrained(...));
# here the pizza task's tiny pretrained Llama, which says "pizza" after "ravin likes " 15% of the time.
task = PizzaTask()
model, tokenizer = task.load_policy("cpu"), task.tokenizer


def reward(prompts, completions):
    return [4.0 if completion == "pizza" else 0.0 for completion in completions]


result = train(model, tokenizer, reward, ["ravin likes "], config=GRPOConfig(learning_rate=1e-3),
               steps=8, max_new_tokens=12, eval_samples=32, seed=0, out="runs/pizza-api")
print(f"accuracy {result.summary['accuracy_before']:.2f} -> {result.summary['accuracy_after']:.2f}")
