"""Simple programming tasks written as data, with their solutions: the request -> code half of the
tiny coder's fine-tuning data (docstring pairs from real code are the other half, see
``request_data``). Each task is an imperative request ("count the vowels in a string") and a
short, complete function or class whose name carries the request's key words (``count_vowels``).

Families are compositional (an operation x a predicate / character class / unit), so the model
sees the same request words mapped to names and bodies in many combinations. None of the
held-out families in ``assets/prompts/heldout_requests.jsonl`` is generated here (a test checks
that no key word of a held-out request names a task here), and nothing is taken from public
benchmarks (HumanEval, MBPP): every task and solution was written for this project."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    request: str  # imperative, lower-case first word: "count the vowels in a string"
    code: str  # the solution: one def or class, no trailing newline
    family: str


def function(name: str, params: str, body: str, doc: str | None = None) -> str:
    """Source of ``def name(params):`` with an optional one-line docstring and a body whose
    lines are given without indentation (nested blocks indented by four spaces)."""
    lines = [f"def {name}({params}):"]
    if doc:
        lines.append(f'    """{doc}"""')
    lines += ["    " + line if line else "" for line in body.strip("\n").splitlines()]
    return "\n".join(lines)


def sentence(request: str) -> str:
    """'count the vowels in a string' -> 'Count the vowels in a string.' (a docstring)."""
    return request[:1].upper() + request[1:].rstrip(".") + "."


# ---------------------------------------------------------------- characters in a string

# key: (plural phrase, singular phrase, test on a character c, imports)
CHAR_CLASSES = {
    "vowels": ("vowels", "vowel", 'c.lower() in "aeiou"'),
    "consonants": ("consonants", "consonant", 'c.isalpha() and c.lower() not in "aeiou"'),
    "digits": ("digits", "digit", "c.isdigit()"),
    "spaces": ("spaces", "space", 'c == " "'),
    "uppercase": ("uppercase letters", "uppercase letter", "c.isupper()"),
    "lowercase": ("lowercase letters", "lowercase letter", "c.islower()"),
    "letters": ("letters", "letter", "c.isalpha()"),
    "punctuation": ("punctuation marks", "punctuation mark", 'c in ".,;:!?\'\\"-"'),
}


def char_class_tasks() -> list[Task]:
    out = []
    for key, (plural, single, test) in CHAR_CLASSES.items():
        one = single.replace(" letter", "").replace(" mark", "")
        specs = [
            (f"count the {plural} in a string", f"count_{key}", "text",
             f"return sum(1 for c in text if {test})"),
            (f"remove the {plural} from a string", f"remove_{key}", "text",
             f'return "".join(c for c in text if not ({test}))'),
            (f"return only the {plural} of a string", f"only_{key}", "text",
             f'return "".join(c for c in text if {test})'),
            (f"check whether a string contains any {plural}", f"has_{key}", "text",
             f"return any({test} for c in text)"),
            (f"check whether a string contains only {plural}", f"all_{key}", "text",
             f"return bool(text) and all({test} for c in text)"),
            (f"find the position of the first {single} in a string", f"first_{one.replace(' ', '_')}_index", "text",
             f"for i, c in enumerate(text):\n    if {test}:\n        return i\nreturn -1"),
            (f"check whether a character is a {single}", f"is_{one.replace(' ', '_')}", "c", f"return {test}"),
        ]
        for request, name, params, body in specs:
            out.append(Task(request, function(name, params, body), "chars"))
            out.append(Task(request, function(name, params, body, sentence(request)), "chars"))
    return out


# ---------------------------------------------------------------- numbers and predicates

# key: (adjective for "a number is ...", plural noun phrase, test on n)
PREDICATES = {
    "even": ("even", "even numbers", "n % 2 == 0"),
    "odd": ("odd", "odd numbers", "n % 2 == 1"),
    "positive": ("positive", "positive numbers", "n > 0"),
    "negative": ("negative", "negative numbers", "n < 0"),
    "prime": ("prime", "prime numbers", "n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))"),
    "square": ("a perfect square", "perfect squares", "n >= 0 and int(n ** 0.5) ** 2 == n"),
    "multiple_of_three": ("a multiple of three", "multiples of three", "n % 3 == 0"),
    "multiple_of_five": ("a multiple of five", "multiples of five", "n % 5 == 0"),
    "single_digit": ("a single digit", "single-digit numbers", "-10 < n < 10"),
}


def predicate_tasks() -> list[Task]:
    out = []
    for key, (adjective, plural, test) in PREDICATES.items():
        noun = key if key.startswith(("multiple", "single")) else key
        specs = [
            (f"check whether a number is {adjective}", f"is_{noun}", "n", f"return {test}"),
            (f"return the {plural} from a list", f"get_{noun}_numbers", "numbers",
             f"return [n for n in numbers if {test}]"),
            (f"filter the {plural} out of a list", f"filter_{noun}", "numbers",
             f"return [n for n in numbers if {test}]"),
            (f"count the {plural} in a list", f"count_{noun}", "numbers",
             f"return sum(1 for n in numbers if {test})"),
            (f"remove the {plural} from a list", f"remove_{noun}", "numbers",
             f"return [n for n in numbers if not ({test})]"),
            (f"return the sum of the {plural} in a list", f"sum_{noun}", "numbers",
             f"return sum(n for n in numbers if {test})"),
            (f"check whether a list contains any {plural}", f"has_{noun}", "numbers",
             f"return any({test} for n in numbers)"),
            (f"check whether all numbers in a list are {plural}", f"all_{noun}", "numbers",
             f"return all({test} for n in numbers)"),
            (f"return the first of the {plural} in a list, or None", f"first_{noun}", "numbers",
             f"for n in numbers:\n    if {test}:\n        return n\nreturn None"),
            (f"return the largest of the {plural} in a list", f"max_{noun}", "numbers",
             f"return max((n for n in numbers if {test}), default=None)"),
        ]
        for request, name, params, body in specs:
            out.append(Task(request, function(name, params, body), "numbers"))
            out.append(Task(request, function(name, params, body, sentence(request)), "numbers"))
    return out


# key: (phrase for one value, expression on x)
TRANSFORMS = {
    "square": ("the square", "x * x"),
    "cube": ("the cube", "x ** 3"),
    "double": ("double", "x * 2"),
    "half": ("half", "x / 2"),
    "negate": ("the negative", "-x"),
    "absolute": ("the absolute value", "abs(x)"),
    "successor": ("the successor", "x + 1"),
    "predecessor": ("the predecessor", "x - 1"),
    "reciprocal": ("the reciprocal", "1 / x"),
}


def transform_tasks() -> list[Task]:
    out = []
    for key, (phrase, expr) in TRANSFORMS.items():
        of = "" if phrase in ("double", "half") else " of"
        specs = [
            (f"return {phrase}{of} a number", key, "x", f"return {expr}"),
            (f"return {phrase}{of} every number in a list", f"{key}_all", "numbers",
             f"return [{expr} for x in numbers]"),
            (f"return the sum of {phrase}{of} the numbers in a list", f"sum_of_{key}s", "numbers",
             f"return sum({expr} for x in numbers)"),
        ]
        for request, name, params, body in specs:
            out.append(Task(request, function(name, params, body), "transforms"))
            out.append(Task(request, function(name, params, body, sentence(request)), "transforms"))
    return out


# from, to, factor (value_to = value_from * factor) or an expression
CONVERSIONS = [
    ("celsius", "fahrenheit", "celsius * 9 / 5 + 32"),
    ("fahrenheit", "celsius", "(fahrenheit - 32) * 5 / 9"),
    ("celsius", "kelvin", "celsius + 273.15"),
    ("kelvin", "celsius", "kelvin - 273.15"),
    ("kilometers", "miles", "kilometers * 0.621371"),
    ("miles", "kilometers", "miles / 0.621371"),
    ("kilograms", "pounds", "kilograms * 2.20462"),
    ("pounds", "kilograms", "pounds / 2.20462"),
    ("meters", "feet", "meters * 3.28084"),
    ("feet", "meters", "feet / 3.28084"),
    ("inches", "centimeters", "inches * 2.54"),
    ("centimeters", "inches", "centimeters / 2.54"),
    ("liters", "gallons", "liters * 0.264172"),
    ("gallons", "liters", "gallons / 0.264172"),
    ("degrees", "radians", "degrees * 3.141592653589793 / 180"),
    ("radians", "degrees", "radians * 180 / 3.141592653589793"),
    ("bytes", "megabytes", "bytes / (1024 * 1024)"),
]


def conversion_tasks() -> list[Task]:
    out = []
    for src, dst, expr in CONVERSIONS:
        for request in (f"convert {src} to {dst}", f"convert a value in {src} to {dst}",
                        f"convert a temperature from {src} to {dst}" if src in ("celsius", "fahrenheit", "kelvin")
                        else f"convert a distance or amount from {src} to {dst}"):
            out.append(Task(request, function(f"{src}_to_{dst}", src, f"return {expr}", sentence(request)), "convert"))
        out.append(Task(f"convert a list of values from {src} to {dst}",
                        function(f"{src}_list_to_{dst}", "values", f"return [{expr.replace(src, 'v')} for v in values]"),
                        "convert"))
    return out


# ---------------------------------------------------------------- hand-written tasks

# Entries separated by lines of '---'; request lines start with '> ', the rest is the solution.
WRITTEN = r'''
> reverse a string
> reverse the characters of a string
def reverse_string(text):
    return text[::-1]
---
> check whether a string is a palindrome
> check if a word is a palindrome, the same forwards and backwards
def is_palindrome(text):
    cleaned = "".join(c.lower() for c in text if c.isalnum())
    return cleaned == cleaned[::-1]
---
> check whether two strings are anagrams
> check if two words are anagrams of each other
def is_anagram(first, second):
    return sorted(first.lower()) == sorted(second.lower())
---
> count the words in a string
> return the number of words in a sentence
def count_words(text):
    return len(text.split())
---
> return the longest word in a sentence
> find the longest word in a string
def longest_word(sentence):
    return max(sentence.split(), key=len, default="")
---
> return the shortest word in a sentence
def shortest_word(sentence):
    return min(sentence.split(), key=len, default="")
---
> reverse the order of the words in a sentence
def reverse_words(sentence):
    return " ".join(reversed(sentence.split()))
---
> convert a string to title case
def to_title_case(text):
    return " ".join(word.capitalize() for word in text.split())
---
> capitalize the first letter of every word in a string
def capitalize_words(text):
    return " ".join(word.capitalize() for word in text.split())
---
> capitalize the first letter of a string
def capitalize_first(text):
    return text[:1].upper() + text[1:]
---
> convert a string to uppercase
def to_uppercase(text):
    return text.upper()
---
> convert a string to lowercase
def to_lowercase(text):
    return text.lower()
---
> swap the case of every letter in a string
def swap_case(text):
    return text.swapcase()
---
> remove the duplicate characters from a string
def remove_duplicate_chars(text):
    seen = set()
    result = []
    for c in text:
        if c not in seen:
            seen.add(c)
            result.append(c)
    return "".join(result)
---
> convert a string from camel case to snake case
def camel_to_snake(name):
    result = []
    for c in name:
        if c.isupper() and result:
            result.append("_")
        result.append(c.lower())
    return "".join(result)
---
> convert a string from snake case to camel case
def snake_to_camel(name):
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)
---
> replace the spaces in a string with underscores
def spaces_to_underscores(text):
    return text.replace(" ", "_")
---
> truncate a string to a maximum length and add an ellipsis
def truncate(text, max_length):
    if len(text) <= max_length:
        return text
    return text[: max_length - 3] + "..."
---
> repeat a string a given number of times
def repeat_string(text, times):
    return text * times
---
> count how many times a substring occurs in a string
def count_substring(text, sub):
    return text.count(sub)
---
> count how often each character occurs in a string
> return a dictionary of character frequencies
def char_frequency(text):
    counts = {}
    for c in text:
        counts[c] = counts.get(c, 0) + 1
    return counts
---
> count how often each word occurs in a text
> return a dictionary of word frequencies
def word_frequency(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
---
> return the most common word in a text
def most_common_word(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return max(counts, key=counts.get, default=None)
---
> find the first character of a string that does not repeat
def first_unique_char(text):
    for c in text:
        if text.count(c) == 1:
            return c
    return None
---
> shift every letter of a string by a number of places (a caesar cipher)
> encrypt a string with a caesar cipher
def caesar_cipher(text, shift):
    result = []
    for c in text:
        if c.isalpha():
            base = ord("a") if c.islower() else ord("A")
            result.append(chr((ord(c) - base + shift) % 26 + base))
        else:
            result.append(c)
    return "".join(result)
---
> rotate a string left by a number of characters
def rotate_string(text, n):
    if not text:
        return text
    n %= len(text)
    return text[n:] + text[:n]
---
> split a sentence into a list of words
def split_words(sentence):
    return sentence.split()
---
> join a list of words into a sentence
def join_words(words):
    return " ".join(words)
---
> return the lengths of the words in a sentence
def word_lengths(sentence):
    return [len(word) for word in sentence.split()]
---
> sort the words of a sentence alphabetically
def sort_words(sentence):
    return " ".join(sorted(sentence.split(), key=str.lower))
---
> return the unique words of a text in order
def unique_words(text):
    seen = []
    for word in text.split():
        if word not in seen:
            seen.append(word)
    return seen
---
> check whether a string starts with a given prefix, ignoring case
def starts_with_ignore_case(text, start):
    return text.lower().startswith(start.lower())
---
> strip the whitespace from every string in a list
def strip_whitespace(strings):
    return [s.strip() for s in strings]
---
> count the lines in a string
def count_lines(text):
    return len(text.splitlines())
---
> count the sentences in a text
def count_sentences(text):
    return sum(text.count(mark) for mark in ".!?")
---
> return the last word of a sentence
def last_word(sentence):
    words = sentence.split()
    return words[-1] if words else ""
---
> return the first word of a sentence
def first_word(sentence):
    words = sentence.split()
    return words[0] if words else ""
---
> remove the duplicates from a list while keeping the order
> remove duplicate items from a list
def remove_duplicates(items):
    seen = set()
    result = []
    for item in items:
        if item not in seen:
            seen.add(item)
            result.append(item)
    return result
---
> flatten a nested list
> flatten a list of lists into one list
def flatten(nested):
    result = []
    for item in nested:
        if isinstance(item, list):
            result.extend(flatten(item))
        else:
            result.append(item)
    return result
---
> split a list into chunks of a given size
def chunk_list(items, size):
    return [items[i : i + size] for i in range(0, len(items), size)]
---
> rotate a list to the right by k positions
def rotate_list(items, k):
    if not items:
        return items
    k %= len(items)
    return items[-k:] + items[:-k]
---
> reverse a list
def reverse_list(items):
    return items[::-1]
---
> merge two sorted lists into one sorted list
def merge_sorted(first, second):
    result = []
    i = j = 0
    while i < len(first) and j < len(second):
        if first[i] <= second[j]:
            result.append(first[i])
            i += 1
        else:
            result.append(second[j])
            j += 1
    return result + first[i:] + second[j:]
---
> zip two lists into a dictionary
> build a dictionary from a list of keys and a list of values
def lists_to_dict(keys, values):
    return dict(zip(keys, values))
---
> interleave the items of two lists
def interleave(first, second):
    result = []
    for a, b in zip(first, second):
        result.extend([a, b])
    longer = first if len(first) > len(second) else second
    return result + longer[min(len(first), len(second)):]
---
> count how many times an item occurs in a list
def count_occurrences(items, target):
    return sum(1 for item in items if item == target)
---
> return the last element of a list
def last_element(items):
    return items[-1] if items else None
---
> return the first n elements of a list
def first_n(items, n):
    return items[:n]
---
> return every other element of a list
def every_other(items):
    return items[::2]
---
> return the running totals of a list of numbers
> compute the cumulative sum of a list
def cumulative_sum(numbers):
    total = 0
    result = []
    for n in numbers:
        total += n
        result.append(total)
    return result
---
> return the items of the first list that are not in the second
def list_difference(first, second):
    exclude = set(second)
    return [item for item in first if item not in exclude]
---
> return the items that two lists have in common
def common_elements(first, second):
    other = set(second)
    return [item for item in first if item in other]
---
> return the union of two lists without duplicates
def list_union(first, second):
    result = list(first)
    for item in second:
        if item not in result:
            result.append(item)
    return result
---
> sort a list in descending order
def sort_descending(items):
    return sorted(items, reverse=True)
---
> sort a list of strings by their length
def sort_by_length(strings):
    return sorted(strings, key=len)
---
> sort a list of dictionaries by a given key
def sort_by_key(records, key):
    return sorted(records, key=lambda record: record[key])
---
> group a list of words by their first letter
def group_by_first_letter(words):
    groups = {}
    for word in words:
        groups.setdefault(word[:1].lower(), []).append(word)
    return groups
---
> split a list into the items that pass a test and the items that fail it
def partition(items, predicate):
    passed, failed = [], []
    for item in items:
        (passed if predicate(item) else failed).append(item)
    return passed, failed
---
> swap the first and last elements of a list
def swap_first_last(items):
    if len(items) > 1:
        items[0], items[-1] = items[-1], items[0]
    return items
---
> move all zeros in a list to the end
def move_zeros_to_end(numbers):
    non_zero = [n for n in numbers if n != 0]
    return non_zero + [0] * (len(numbers) - len(non_zero))
---
> find the missing number in a list containing the numbers from 1 to n
def find_missing_number(numbers):
    n = len(numbers) + 1
    return n * (n + 1) // 2 - sum(numbers)
---
> find the items that occur more than once in a list
> return the duplicates in a list
def find_duplicates(items):
    seen, duplicates = set(), []
    for item in items:
        if item in seen and item not in duplicates:
            duplicates.append(item)
        seen.add(item)
    return duplicates
---
> check whether a list is sorted
def is_sorted(items):
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))
---
> check whether a list is empty
def is_empty(items):
    return len(items) == 0
---
> search for a value in a sorted list with binary search
def binary_search(items, target):
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1
---
> return the index of a value in a list, or -1
> search for a value in a list with linear search
def linear_search(items, target):
    for index, item in enumerate(items):
        if item == target:
            return index
    return -1
---
> sort a list with bubble sort
def bubble_sort(items):
    items = list(items)
    for end in range(len(items) - 1, 0, -1):
        for i in range(end):
            if items[i] > items[i + 1]:
                items[i], items[i + 1] = items[i + 1], items[i]
    return items
---
> sort a list with insertion sort
def insertion_sort(items):
    items = list(items)
    for i in range(1, len(items)):
        current = items[i]
        j = i - 1
        while j >= 0 and items[j] > current:
            items[j + 1] = items[j]
            j -= 1
        items[j + 1] = current
    return items
---
> sort a list with selection sort
def selection_sort(items):
    items = list(items)
    for i in range(len(items)):
        smallest = min(range(i, len(items)), key=items.__getitem__)
        items[i], items[smallest] = items[smallest], items[i]
    return items
---
> sort a list with merge sort
def merge_sort(items):
    if len(items) <= 1:
        return list(items)
    middle = len(items) // 2
    left, right = merge_sort(items[:middle]), merge_sort(items[middle:])
    result = []
    while left and right:
        result.append(left.pop(0) if left[0] <= right[0] else right.pop(0))
    return result + left + right
---
> sort a list with quicksort
def quick_sort(items):
    if len(items) <= 1:
        return list(items)
    pivot, *rest = items
    smaller = [x for x in rest if x < pivot]
    larger = [x for x in rest if x >= pivot]
    return quick_sort(smaller) + [pivot] + quick_sort(larger)
---
> return the index of the largest number in a list
def index_of_max(numbers):
    return max(range(len(numbers)), key=numbers.__getitem__)
---
> add two lists of numbers element by element
def add_lists(first, second):
    return [a + b for a, b in zip(first, second)]
---
> return the sum of a list of numbers
def sum_list(numbers):
    total = 0
    for n in numbers:
        total += n
    return total
---
> return the product of a list of numbers
> multiply all the numbers in a list
def product(numbers):
    result = 1
    for n in numbers:
        result *= n
    return result
---
> return the largest number in a list
> find the maximum of a list
def find_max(numbers):
    largest = numbers[0]
    for n in numbers[1:]:
        if n > largest:
            largest = n
    return largest
---
> return the smallest number in a list
> find the minimum of a list
def find_min(numbers):
    smallest = numbers[0]
    for n in numbers[1:]:
        if n < smallest:
            smallest = n
    return smallest
---
> return the average of a list of numbers
> compute the mean of a list of numbers
def average(numbers):
    return sum(numbers) / len(numbers) if numbers else 0.0
---
> return the median of a list of numbers
def median(numbers):
    ordered = sorted(numbers)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
---
> return the difference between the largest and smallest numbers in a list
def value_range(numbers):
    return max(numbers) - min(numbers)
---
> return the second largest number in a list
def second_largest(numbers):
    unique = sorted(set(numbers))
    return unique[-2] if len(unique) > 1 else None
---
> return the second smallest number in a list
def second_smallest(numbers):
    unique = sorted(set(numbers))
    return unique[1] if len(unique) > 1 else None
---
> return the most common item in a list
def most_common(items):
    counts = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return max(counts, key=counts.get, default=None)
---
> count the distinct values in a list
def count_unique(items):
    return len(set(items))
---
> swap the keys and values of a dictionary
> invert a dictionary
def invert_dict(mapping):
    return {value: key for key, value in mapping.items()}
---
> merge two dictionaries into a new one
def merge_dicts(first, second):
    merged = dict(first)
    merged.update(second)
    return merged
---
> return the key with the largest value in a dictionary
def key_of_max_value(mapping):
    return max(mapping, key=mapping.get, default=None)
---
> sort a dictionary by its values
def sort_dict_by_value(mapping):
    return dict(sorted(mapping.items(), key=lambda item: item[1]))
---
> keep the dictionary entries whose value is above a threshold
def filter_dict_by_value(mapping, threshold):
    return {key: value for key, value in mapping.items() if value > threshold}
---
> remove the entries whose value is None from a dictionary
def drop_none_values(mapping):
    return {key: value for key, value in mapping.items() if value is not None}
---
> return the sum of the values in a dictionary
def sum_dict_values(mapping):
    return sum(mapping.values())
---
> return the keys of a dictionary in sorted order
def sorted_keys(mapping):
    return sorted(mapping)
---
> look up a nested key path in a dictionary
def get_nested(mapping, keys, default=None):
    current = mapping
    for key in keys:
        if not isinstance(current, dict) or key not in current:
            return default
        current = current[key]
    return current
---
> count how often each item occurs in a list
def count_items(items):
    counts = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts
---
> compute the factorial of a number
> return n factorial
def factorial(n):
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result
---
> compute the factorial of a number recursively
def factorial_recursive(n):
    if n <= 1:
        return 1
    return n * factorial_recursive(n - 1)
---
> return the nth fibonacci number
> compute the fibonacci number at position n
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
---
> return the first n fibonacci numbers
> return a list of fibonacci numbers
def fibonacci_sequence(n):
    sequence = []
    a, b = 0, 1
    for _ in range(n):
        sequence.append(a)
        a, b = b, a + b
    return sequence
---
> compute the gcd of two integers
def gcd(a, b):
    while b:
        a, b = b, a % b
    return abs(a)
---
> return the greatest common divisor of two numbers
def greatest_common_divisor(a, b):
    while b:
        a, b = b, a % b
    return abs(a)
---
> compute the lcm of two integers
def lcm(a, b):
    def gcd(x, y):
        while y:
            x, y = y, x % y
        return x
    return abs(a * b) // gcd(a, b) if a and b else 0
---
> return the least common multiple of two numbers
def least_common_multiple(a, b):
    multiple = max(a, b)
    while multiple % a or multiple % b:
        multiple += max(a, b)
    return multiple
---
> return the sum of the digits of a number
def sum_digits(n):
    return sum(int(d) for d in str(abs(n)))
---
> count the digits of a number
def count_digits(n):
    return len(str(abs(n)))
---
> reverse the digits of a number
def reverse_number(n):
    sign = -1 if n < 0 else 1
    return sign * int(str(abs(n))[::-1])
---
> return the divisors of a number
def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]
---
> return the prime factors of a number
def prime_factors(n):
    factors = []
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1
    if n > 1:
        factors.append(n)
    return factors
---
> return all prime numbers up to n
> list the primes below a limit with a sieve
def primes_up_to(n):
    sieve = [True] * (n + 1)
    sieve[:2] = [False, False][: n + 1]
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            for j in range(i * i, n + 1, i):
                sieve[j] = False
    return [i for i, is_prime in enumerate(sieve) if is_prime]
---
> check whether a number is a perfect number
def is_perfect_number(n):
    return n > 1 and sum(d for d in range(1, n) if n % d == 0) == n
---
> check whether a number is an armstrong number
def is_armstrong(n):
    digits = str(n)
    return n == sum(int(d) ** len(digits) for d in digits)
---
> count the steps of the collatz sequence from n down to 1
def collatz_steps(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
---
> compute the binomial coefficient n choose k
def binomial(n, k):
    if k < 0 or k > n:
        return 0
    result = 1
    for i in range(1, k + 1):
        result = result * (n - k + i) // i
    return result
---
> compute the square root of a number with newton's method
def newton_sqrt(x, tolerance=1e-10):
    guess = x / 2 or 1.0
    while abs(guess * guess - x) > tolerance:
        guess = (guess + x / guess) / 2
    return guess
---
> return the sum of the numbers from 1 to n
def sum_to_n(n):
    return n * (n + 1) // 2
---
> check whether a number lies between two bounds
def is_between(value, low, high):
    return low <= value <= high
---
> return the larger of two numbers
def larger(a, b):
    return a if a > b else b
---
> return the sign of a number
def sign(x):
    if x > 0:
        return 1
    if x < 0:
        return -1
    return 0
---
> compute the area of a rectangle
def rectangle_area(width, height):
    return width * height
---
> round a number to two decimal places
def round_two(x):
    return round(x, 2)
---
> convert a number to its binary representation
def to_binary(n):
    return bin(n)[2:]
---
> print the numbers from 1 to n, but fizz for multiples of three, buzz for multiples of five and fizzbuzz for both
> solve fizzbuzz up to n
def fizzbuzz(n):
    for i in range(1, n + 1):
        if i % 15 == 0:
            print("FizzBuzz")
        elif i % 3 == 0:
            print("Fizz")
        elif i % 5 == 0:
            print("Buzz")
        else:
            print(i)
---
> print the multiplication table of a number
def multiplication_table(n, upto=10):
    for i in range(1, upto + 1):
        print(f"{n} x {i} = {n * i}")
---
> greet a person by name
def greet(name):
    return f"Hello, {name}!"
---
> read the lines of a text file into a list
def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]
---
> count the lines in a file
def count_file_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)
---
> write a list of strings to a file, one per line
def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
---
> append a line of text to a file
def append_line(path, line):
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
---
> load a json file
> read a json file into a dictionary
def load_json(path):
    import json

    with open(path, encoding="utf-8") as f:
        return json.load(f)
---
> save a dictionary to a json file
def save_json(path, data):
    import json

    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
---
> read the rows of a csv file
def read_csv_rows(path):
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))
---
> return the size of a file in bytes
def file_size(path):
    import os

    return os.path.getsize(path)
---
> list the files in a directory that have a given extension
def files_with_extension(directory, extension):
    import os

    return sorted(name for name in os.listdir(directory) if name.endswith(extension))
---
> count the words in a text file
def count_file_words(path):
    with open(path, encoding="utf-8") as f:
        return sum(len(line.split()) for line in f)
---
> return a random password of a given length
> generate a random password
def random_password(length=12):
    import random
    import string

    alphabet = string.ascii_letters + string.digits
    return "".join(random.choice(alphabet) for _ in range(length))
---
> roll a six-sided die
def roll_die():
    import random

    return random.randint(1, 6)
---
> flip a coin
def flip_coin():
    import random

    return random.choice(["heads", "tails"])
---
> shuffle a list
def shuffle_list(items):
    import random

    items = list(items)
    random.shuffle(items)
    return items
---
> check whether an email address looks valid
def is_valid_email(address):
    name, at, domain = address.partition("@")
    return bool(name) and bool(at) and "." in domain
---
> check whether a password is strong
def is_strong_password(password):
    return (len(password) >= 8 and any(c.isupper() for c in password)
            and any(c.islower() for c in password) and any(c.isdigit() for c in password))
---
> parse a string of key=value pairs into a dictionary
def parse_key_values(text):
    result = {}
    for part in text.split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            result[key.strip()] = value.strip()
    return result
---
> return today's date as a string
def today_string():
    import datetime

    return datetime.date.today().isoformat()
'''

WRITTEN_CLASSES = r'''
> create a stack class with push and pop
> implement a stack
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def is_empty(self):
        return not self.items
---
> create a queue class
> implement a first-in first-out queue
class Queue:
    def __init__(self):
        self.items = []

    def enqueue(self, item):
        self.items.append(item)

    def dequeue(self):
        return self.items.pop(0)

    def __len__(self):
        return len(self.items)
---
> create a class for a bank account with deposit and withdraw methods
class BankAccount:
    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        self.balance += amount

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
---
> create a class for a point with x and y coordinates
class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        return f"Point({self.x}, {self.y})"
---
> create a rectangle class that computes its area
class Rectangle:
    def __init__(self, width, height):
        self.width = width
        self.height = height

    def area(self):
        return self.width * self.height
---
> create a counter class that counts up
class Counter:
    def __init__(self):
        self.count = 0

    def increment(self):
        self.count += 1
        return self.count

    def reset(self):
        self.count = 0
---
> create a class for a person with a name and an age
class Person:
    def __init__(self, name, age):
        self.name = name
        self.age = age

    def greet(self):
        return f"Hi, I am {self.name}."
---
> create a class for a node of a linked list
> implement a linked list node
class Node:
    def __init__(self, value, next=None):
        self.value = value
        self.next = next
---
> create a class for a linked list with an append method
class LinkedList:
    def __init__(self):
        self.head = None

    def append(self, value):
        node = Node(value)
        if self.head is None:
            self.head = node
            return
        current = self.head
        while current.next:
            current = current.next
        current.next = node
---
> create a class for a to-do list
class TodoList:
    def __init__(self):
        self.tasks = []

    def add(self, task):
        self.tasks.append(task)

    def remove(self, task):
        self.tasks.remove(task)
---
> create an inventory class that tracks item quantities
class Inventory:
    def __init__(self):
        self.quantities = {}

    def add(self, item, quantity=1):
        self.quantities[item] = self.quantities.get(item, 0) + quantity

    def remove(self, item, quantity=1):
        self.quantities[item] = max(0, self.quantities.get(item, 0) - quantity)
---
> create a context manager class that measures elapsed time
class Timer:
    def __enter__(self):
        import time

        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import time

        self.elapsed = time.perf_counter() - self.start
        return False
'''


def parse_written(text: str, family: str) -> list[Task]:
    out = []
    for entry in text.strip().split("\n---\n"):
        lines = entry.strip("\n").splitlines()
        requests = [line[2:].strip() for line in lines if line.startswith("> ")]
        code = "\n".join(line for line in lines if not line.startswith("> ")).strip("\n")
        for request in requests:
            out.append(Task(request, code, family))
    return out


def all_tasks() -> list[Task]:
    return (char_class_tasks() + predicate_tasks() + transform_tasks() + conversion_tasks()
            + parse_written(WRITTEN, "written") + parse_written(WRITTEN_CLASSES, "classes"))
